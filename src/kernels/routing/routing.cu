// Routing on the device (contract: routing.cuh, formulas: docs/routing.md).
// A warp chooses one token's experts; at large T a block's four tokens are
// weighed together. The per-token math (selection keys, groups, weights)
// lives in routing_device.cuh, shared with the fused routing + permute
// kernel.
#include <cstdint>
#include <stdexcept>

#include "core/routing_launch_shape.h"
#include "kernels/common/common.cuh"
#include "kernels/routing/routing.cuh"
#include "kernels/routing/routing_device.cuh"

namespace unimoe {
namespace {

using namespace routing_detail;

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * kWarpSize;

// Warp w of a block routes token blockIdx.x * 4 + w. Weights two ways
// (kBatched, from split_weighs_in_batches):
//   - each warp weighs its own token's K experts on lanes 0..K-1;
//   - batched: each warp parks its token's experts in shared memory, and
//     after one barrier the block's first ceil(4 * W / 32) warps weigh all
//     four tokens at once, token j's k-th expert on entry j * W + k (W:
//     chosen_width, the smallest power of two >= K; chosen_weight's
//     segments). One token's weights keep only K of a warp's lanes busy
//     (fp64 exp, sums and divisions), so at K <= 8 one warp weighs four
//     tokens for the instructions of one; the barrier costs latency.
// Two kernels rather than a run-time switch: holding both ways made the
// per-warp one 1-2% slower for DeepSeekV3 at T = 256..16384 (session 13
// run 3).
constexpr int kParked = kWarpsPerBlock * kMaxTopK;  // entries: 4 tokens at W = 32
static_assert(kParked >= kWarpSize, "a weighing warp's entries lie within the parked rows");

template <typename LogitT, int kPerLane, bool kDeepSeek, bool kSortedRuns, bool kBatched,
          bool kKeptHalves>
__global__ void __launch_bounds__(kThreads) routing_kernel(RoutingKernelParams p) {
  pdl_begin();
  // Group keys of each warp; only DeepSeek's group stage uses them (and
  // rounds_by_kept_halves, 8-byte entries).
  __shared__ alignas(16) float s_keys[kWarpsPerBlock][kDeepSeek ? kPerLane * kWarpSize : 1];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if constexpr (!kBatched) {
    const int token = blockIdx.x * kWarpsPerBlock + warp;
    if (token >= p.num_tokens) return;  // the whole warp leaves together
    const TokenChoice choice =
        route_token<LogitT, kPerLane, kDeepSeek, false, true, kSortedRuns, true, kKeptHalves>(
            p, token, lane, s_keys[warp]);
    if (lane < p.top_k) {
      const size_t out = static_cast<size_t>(token) * p.top_k + lane;
      p.topk_ids[out] = choice.expert;
      p.topk_weights[out] = choice.weight;
    }
    return;
  }
  __shared__ int32_t s_expert[kBatched ? kParked : 1];
  // The logit, where the key gave it back.
  __shared__ float s_x[kBatched && !kDeepSeek ? kParked : 1];
  __shared__ RowSoftmax s_softmax[kBatched ? kWarpsPerBlock : 1];
  const int first = blockIdx.x * kWarpsPerBlock;
  const int width = p.chosen_width;
  if (first + warp < p.num_tokens) {  // uniform per warp
    const TokenExperts t =
        choose_experts<LogitT, kPerLane, kDeepSeek, false, true, kSortedRuns, true, kKeptHalves>(
            p, first + warp, lane, s_keys[warp]);
    if (lane < width) {  // lanes K..W-1 park values that are never weighed
      s_expert[warp * width + lane] = t.expert;
      if constexpr (!kDeepSeek) s_x[warp * width + lane] = t.x;
    }
    if (!kDeepSeek && lane == 0) s_softmax[warp] = t.softmax;
  }
  __syncthreads();
  if (warp * kWarpSize >= kWarpsPerBlock * width) return;  // not a weighing warp (uniform)
  const int entry = warp * kWarpSize + lane;
  const int log2_width = __ffs(width) - 1;
  const int j = entry >> log2_width, k = entry & (width - 1);
  const int token = first + j;
  const bool parked = j < kWarpsPerBlock && token < p.num_tokens;
  TokenExperts mine{0, 0.0f, RowSoftmax{0.0f, 0.0, 0}};
  if (parked) {
    mine.expert = s_expert[entry];
    if constexpr (!kDeepSeek) {
      mine.x = s_x[entry];
      mine.softmax = s_softmax[j];
    }
  }
  const bool active = parked && k < p.top_k;
  const float weight = weigh_experts<LogitT, kDeepSeek, true>(p, mine, token, active);
  if (active) {
    const size_t out = static_cast<size_t>(token) * p.top_k + k;
    p.topk_ids[out] = mine.expert;
    p.topk_weights[out] = weight;
  }
}

template <typename LogitT, int kPerLane, bool kDeepSeek, bool kSortedRuns, bool kKeptHalves>
void launch_batched(const RoutingKernelParams& p, int blocks, bool batched, cudaStream_t stream) {
  if (batched) {
    launch_pdl(routing_kernel<LogitT, kPerLane, kDeepSeek, kSortedRuns, true, kKeptHalves>, blocks,
               kThreads, 0, stream, p);
  } else {
    launch_pdl(routing_kernel<LogitT, kPerLane, kDeepSeek, kSortedRuns, false, kKeptHalves>, blocks,
               kThreads, 0, stream, p);
  }
}

// kSortedRuns where routing_shape::split_sorts_runs says
// (UNIMOE_SPLIT_SORT_FROM_TOPK overrides it, for sweeps); widths above
// kSortMaxSlots keep the tree. DeepSeek's sorted rounds take the kept
// halves where they can (compacts_kept_lanes; UNIMOE_SPLIT_KEPT_HALVES=0
// turns them off, for sweeps).
template <typename LogitT, int kPerLane, bool kDeepSeek>
void launch_width(const RoutingKernelParams& p, int blocks, bool batched, cudaStream_t stream) {
  if constexpr (kPerLane <= kSortMaxSlots) {
    static const int forced_top_k = env_int("UNIMOE_SPLIT_SORT_FROM_TOPK", 0);
    static const bool kept_halves = env_switch_on("UNIMOE_SPLIT_KEPT_HALVES");
    if (routing_shape::split_sorts_runs(kPerLane, p.top_k, p.num_tokens, kDeepSeek, forced_top_k)) {
      if constexpr (kDeepSeek && kPerLane % 2 == 0) {
        if (kept_halves && compacts_kept_lanes(p, kPerLane)) {
          launch_batched<LogitT, kPerLane, kDeepSeek, true, true>(p, blocks, batched, stream);
          return;
        }
      }
      launch_batched<LogitT, kPerLane, kDeepSeek, true, false>(p, blocks, batched, stream);
      return;
    }
  }
  launch_batched<LogitT, kPerLane, kDeepSeek, false, false>(p, blocks, batched, stream);
}

template <typename LogitT, bool kDeepSeek>
void launch_for_width(const RoutingKernelParams& p, int blocks, bool batched, cudaStream_t stream) {
  with_slots_per_lane(p.num_experts, [&](auto slots) {
    launch_width<LogitT, decltype(slots)::value, kDeepSeek>(p, blocks, batched, stream);
  });
  UNIMOE_LAUNCH_CHECK();
}

template <typename LogitT>
void launch_for_type(const RoutingKernelParams& p, bool deepseek, int blocks, bool batched,
                     cudaStream_t stream) {
  if (deepseek) {
    launch_for_width<LogitT, true>(p, blocks, batched, stream);
  } else {
    launch_for_width<LogitT, false>(p, blocks, batched, stream);
  }
}

}  // namespace

routing_shape::SplitWeight split_weight(RoutingPolicy policy) {
  using routing_shape::SplitWeight;
  switch (policy) {
    case RoutingPolicy::TopK: return SplitWeight::kLogit;
    case RoutingPolicy::Default:
    case RoutingPolicy::RenormalizeNaive: return SplitWeight::kRowSoftmax;
    case RoutingPolicy::DeepSeekV3:
    case RoutingPolicy::MiniMax2: return SplitWeight::kDeepSeek;
    case RoutingPolicy::Renormalize:
    case RoutingPolicy::Sigmoid:
    case RoutingPolicy::SigmoidRenorm:
    case RoutingPolicy::TopKSigmoid:
    case RoutingPolicy::Llama4: break;
  }
  return SplitWeight::kChosen;
}

bool split_weighs_in_batches(int num_tokens, RoutingPolicy policy) {
  static const int forced = env_int("UNIMOE_SPLIT_BATCH_MIN_TOKENS", 0);
  return routing_shape::split_weighs_in_batches(num_tokens, split_weight(policy), forced);
}

bool split_takes_octets(const routing_detail::RoutingKernelParams& p) {
  static const int forced = env_int("UNIMOE_SPLIT_OCTETS_MIN_TOKENS", 0);
  return routing_shape::split_takes_octets(is_deepseek(p.policy), p.num_experts, p.top_k,
                                           p.n_group, p.num_tokens, forced);
}

bool routing_writes_counts(const RoutingParams& params, const PermuteCounts& counts) {
  static const bool on = env_switch_on("UNIMOE_SPLIT_OCTET_COUNT");
  if (!on || counts.table == nullptr || params.num_tokens <= 0 || params.logits == nullptr)
    return false;
  check_routing_config(params, "routing_writes_counts");
  const int top_k = params.config.top_k;
  if (static_cast<long long>(params.num_tokens) * top_k != counts.rows) return false;
  if (counts.num_local <= 0 || counts.local_offset < 0) return false;
  return split_takes_octets(make_routing_kernel_params(params)) &&
         routing_shape::octet_count_blocks(top_k, counts.chunk_rows) > 0;
}

void launch_routing(const RoutingParams& params, cudaStream_t stream, const PermuteCounts* counts) {
  check_routing_config(params, "launch_routing");
  if (params.num_tokens == 0) return;
  if (params.logits == nullptr || params.topk_ids == nullptr || params.topk_weights == nullptr)
    throw std::invalid_argument("launch_routing: logits, topk_ids and topk_weights must be set");
  const RoutingKernelParams p = make_routing_kernel_params(params);
  if (split_takes_octets(p)) {
    const bool count = counts != nullptr && routing_writes_counts(params, *counts);
    launch_routing_octets(p, params.config.logits_type == LogitsType::BF16, count ? counts : nullptr,
                          stream);
    return;
  }
  const int blocks = ceil_div(params.num_tokens, kWarpsPerBlock);
  const bool batched = split_weighs_in_batches(params.num_tokens, p.policy);
  if (params.config.logits_type == LogitsType::BF16) {
    launch_for_type<uint16_t>(p, is_deepseek(p.policy), blocks, batched, stream);
  } else {
    launch_for_type<float>(p, is_deepseek(p.policy), blocks, batched, stream);
  }
}

void launch_split_routing_permute(const RoutingParams& routing, const PermuteParams& permute,
                                  cudaStream_t stream) {
  if (permute.topk_ids != routing.topk_ids || permute.num_tokens != routing.num_tokens ||
      permute.top_k != routing.config.top_k)
    throw std::invalid_argument(
        "launch_split_routing_permute: the permute must take the routing's ids (the same "
        "topk_ids, T and K)");
  const PermuteCounts counts = permute_counts(permute);
  const bool counted = routing_writes_counts(routing, counts);
  launch_routing(routing, stream, counted ? &counts : nullptr);
  launch_permute(permute, stream, counted);
}

}  // namespace unimoe
