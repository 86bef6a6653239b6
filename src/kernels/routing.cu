// Routing on the device (contract: routing.cuh, formulas: docs/routing.md).
// One warp per token; the per-token math (selection keys, groups, weights)
// lives in routing_device.cuh, shared with the fused routing + permute kernel.
#include <cstdint>
#include <stdexcept>

#include "kernels/common.cuh"
#include "kernels/routing.cuh"
#include "kernels/routing_device.cuh"

namespace unimoe {
namespace {

using namespace routing_detail;

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * kWarpSize;

template <typename LogitT, int kPerLane, bool kDeepSeek, bool kSortedRuns>
__global__ void __launch_bounds__(kThreads) routing_kernel(RoutingKernelParams p) {
  pdl_begin();
  // Group keys of each warp; only DeepSeek's group stage uses them.
  __shared__ float s_keys[kWarpsPerBlock][kDeepSeek ? kPerLane * kWarpSize : 1];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int token = blockIdx.x * kWarpsPerBlock + warp;
  if (token >= p.num_tokens) return;  // the whole warp leaves together
  const TokenChoice choice =
      route_token<LogitT, kPerLane, kDeepSeek, false, true, kSortedRuns, true>(p, token, lane, s_keys[warp]);
  if (lane < p.top_k) {
    const size_t out = static_cast<size_t>(token) * p.top_k + lane;
    p.topk_ids[out] = choice.expert;
    p.topk_weights[out] = choice.weight;
  }
}

// kSortedRuns where the runs are short enough and K large enough
// (sorts_runs); widths above kSortMaxSlots keep the tree.
template <typename LogitT, int kPerLane, bool kDeepSeek>
void launch_width(const RoutingKernelParams& p, int blocks, cudaStream_t stream) {
  if constexpr (kPerLane <= kSortMaxSlots) {
    if (sorts_runs(kPerLane, p.top_k)) {
      launch_pdl(routing_kernel<LogitT, kPerLane, kDeepSeek, true>, blocks, kThreads, 0, stream, p);
      return;
    }
  }
  launch_pdl(routing_kernel<LogitT, kPerLane, kDeepSeek, false>, blocks, kThreads, 0, stream, p);
}

template <typename LogitT, bool kDeepSeek>
void launch_for_width(const RoutingKernelParams& p, int blocks, cudaStream_t stream) {
  switch (slots_per_lane(p.num_experts)) {
    case 1: launch_width<LogitT, 1, kDeepSeek>(p, blocks, stream); break;
    case 2: launch_width<LogitT, 2, kDeepSeek>(p, blocks, stream); break;
    case 4: launch_width<LogitT, 4, kDeepSeek>(p, blocks, stream); break;
    case 8: launch_width<LogitT, 8, kDeepSeek>(p, blocks, stream); break;
    case 16: launch_width<LogitT, 16, kDeepSeek>(p, blocks, stream); break;
    default: launch_width<LogitT, 32, kDeepSeek>(p, blocks, stream); break;
  }
  UNIMOE_LAUNCH_CHECK();
}

template <typename LogitT>
void launch_for_type(const RoutingKernelParams& p, bool deepseek, int blocks,
                     cudaStream_t stream) {
  if (deepseek) {
    launch_for_width<LogitT, true>(p, blocks, stream);
  } else {
    launch_for_width<LogitT, false>(p, blocks, stream);
  }
}

}  // namespace

void launch_routing(const RoutingParams& params, cudaStream_t stream) {
  check_routing_config(params, "launch_routing");
  if (params.num_tokens == 0) return;
  if (params.logits == nullptr || params.topk_ids == nullptr || params.topk_weights == nullptr)
    throw std::invalid_argument("launch_routing: logits, topk_ids and topk_weights must be set");
  const RoutingKernelParams p = make_routing_kernel_params(params);
  const int blocks = ceil_div(params.num_tokens, kWarpsPerBlock);
  if (params.config.logits_type == LogitsType::BF16) {
    launch_for_type<uint16_t>(p, is_deepseek(p.policy), blocks, stream);
  } else {
    launch_for_type<float>(p, is_deepseek(p.policy), blocks, stream);
  }
}

}  // namespace unimoe
