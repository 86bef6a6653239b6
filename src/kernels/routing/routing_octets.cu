// The launchers of the split chain's DeepSeek routing kernel of eight
// lanes a token (routing_octets_kernel.cuh, which describes the kernel):
// which instantiation serves a call, and the grid.
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "core/routing_launch_shape.h"
#include "kernels/common/common.cuh"
#include "kernels/routing/routing.cuh"
#include "kernels/routing/routing_device.cuh"
#include "kernels/routing/routing_octets_steps.cuh"
#include "kernels/routing/routing_octets_kernel.cuh"

namespace unimoe {
namespace {

template <typename LogitT, bool kFilter, bool kCount>
void launch_mode(const RoutingKernelParams& p, const OctetCounts& counts, int blocks,
                 KernelStream stream) {
  const auto launch = [&](auto kernel) {
    launch_pdl(kernel, blocks, kThreads, 0, stream, p, counts);
  };
  switch (p.num_experts / kOctetLanes) {
    case 8: launch(routing_octets_kernel<LogitT, 8, kFilter, kCount>); break;
    case 16: launch(routing_octets_kernel<LogitT, 16, kFilter, kCount>); break;
    case 32: launch(routing_octets_kernel<LogitT, 32, kFilter, kCount>); break;
    default: launch(routing_octets_kernel<LogitT, 48, kFilter, kCount>); break;
  }
}

// With `counts`: the grid rounded up to whole permute chunks
// (octet_count_blocks blocks each; blocks past the tokens count zeros).
template <typename LogitT, bool kCount>
void launch_for_slots(const RoutingKernelParams& p, bool filter, const PermuteCounts* counts,
                      KernelStream stream) {
  OctetCounts c;
  if constexpr (kCount) {
    c = OctetCounts{counts->table, counts->local_offset, counts->num_local,
                    routing_shape::octet_count_blocks(p.top_k, counts->chunk_rows)};
    if (c.blocks < 1 || counts->table == nullptr)
      throw std::invalid_argument("launch_routing: these permute counts are not the octet kernel's");
  }
  const int blocks = ceil_div(ceil_div(p.num_tokens, kTokensPerBlock), c.blocks) * c.blocks;
  if constexpr (kCount) {
    if (blocks / c.blocks != counts->num_chunks)
      throw std::invalid_argument("launch_routing: the permute chunks are not whole octet blocks");
  }
  if (filter) {
    launch_mode<LogitT, true, kCount>(p, c, blocks, stream);
  } else {
    launch_mode<LogitT, false, kCount>(p, c, blocks, stream);
  }
  UNIMOE_LAUNCH_CHECK();
}

template <typename LogitT>
void launch_for_counts(const RoutingKernelParams& p, bool filter, const PermuteCounts* counts,
                       KernelStream stream) {
  if (counts != nullptr) {
    launch_for_slots<LogitT, true>(p, filter, counts, stream);
  } else {
    launch_for_slots<LogitT, false>(p, filter, counts, stream);
  }
}

}  // namespace

void launch_routing_octets(const RoutingKernelParams& p, bool bf16_logits, bool filter,
                           const PermuteCounts* counts, KernelStream stream) {
  if (bf16_logits) {
    launch_for_counts<uint16_t>(p, filter, counts, stream);
  } else {
    launch_for_counts<float>(p, filter, counts, stream);
  }
}

}  // namespace unimoe
