// Routing on the device (contract: routing.cuh, formulas: docs/routing.md).
// A warp chooses one token's experts; at large T a block's four tokens are
// weighed together. The per-token math (selection keys, groups, weights)
// lives in routing_device.cuh, shared with the fused routing + permute
// kernel.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/routing_launch_shape.h"
#include "kernels/common/common.cuh"
#include "kernels/routing/fused_routing.cuh"
#include "kernels/routing/routing.cuh"
#include "kernels/routing/routing_device.cuh"

namespace unimoe {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("launch_routing: " + message);
}

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
// per-warp one 1-2% slower for DeepSeekV3 at T = 256..16384 (measured on
// an H200).
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
void launch_batched(const RoutingKernelParams& p, const RoutingPlan& plan, KernelStream stream) {
  if (plan.split_batched) {
    launch_pdl(routing_kernel<LogitT, kPerLane, kDeepSeek, kSortedRuns, true, kKeptHalves>,
               plan.split_blocks, kThreads, 0, stream, p);
  } else {
    launch_pdl(routing_kernel<LogitT, kPerLane, kDeepSeek, kSortedRuns, false, kKeptHalves>,
               plan.split_blocks, kThreads, 0, stream, p);
  }
}

// The sorted runs where the plan takes them (routing_shape::split_sorts_runs);
// widths above kSortMaxSlots keep the tree. DeepSeek's sorted rounds take
// the kept halves where the plan says (compacts_kept_lanes).
template <typename LogitT, int kPerLane, bool kDeepSeek>
void launch_width(const RoutingKernelParams& p, const RoutingPlan& plan, KernelStream stream) {
  if constexpr (kPerLane <= kSortMaxSlots) {
    if (plan.split_sorted_runs) {
      if constexpr (kDeepSeek && kPerLane % 2 == 0) {
        if (plan.split_kept_halves) {
          require(compacts_kept_lanes(p, kPerLane), "the plan's kept halves do not serve this config");
          launch_batched<LogitT, kPerLane, kDeepSeek, true, true>(p, plan, stream);
          return;
        }
      }
      require(!plan.split_kept_halves, "the plan's kept halves do not serve this config");
      launch_batched<LogitT, kPerLane, kDeepSeek, true, false>(p, plan, stream);
      return;
    }
  }
  require(!plan.split_sorted_runs, "the plan sorts runs wider than the kernels do");
  launch_batched<LogitT, kPerLane, kDeepSeek, false, false>(p, plan, stream);
}

template <typename LogitT, bool kDeepSeek>
void launch_for_width(const RoutingKernelParams& p, const RoutingPlan& plan, KernelStream stream) {
  with_slots_per_lane(p.num_experts, [&](auto slots) {
    launch_width<LogitT, decltype(slots)::value, kDeepSeek>(p, plan, stream);
  });
  UNIMOE_LAUNCH_CHECK();
}

template <typename LogitT>
void launch_for_type(const RoutingKernelParams& p, bool deepseek, const RoutingPlan& plan,
                     KernelStream stream) {
  if (deepseek) {
    launch_for_width<LogitT, true>(p, plan, stream);
  } else {
    launch_for_width<LogitT, false>(p, plan, stream);
  }
}

}  // namespace

void launch_routing(const RoutingParams& params, const RoutingPlan& plan, KernelStream stream,
                    const PermuteCounts* counts) {
  check_routing_config(params, "launch_routing");
  if (params.num_tokens == 0 || plan.kernel == RoutingKernel::None) return;
  if (params.logits == nullptr || params.topk_ids == nullptr || params.topk_weights == nullptr)
    throw std::invalid_argument("launch_routing: logits, topk_ids and topk_weights must be set");
  const RoutingKernelParams p = make_routing_kernel_params(params);
  const bool bf16 = params.config.logits_type == LogitsType::BF16;
  if (plan.kernel == RoutingKernel::SplitOctets) {
    require(plan.routing_counts_rows == (counts != nullptr),
            "the permute counts must be given exactly where the plan has the octet kernel count "
            "the rows");
    // The filter mode stages rows by 16-byte copies: aligned logits only
    // (every row is then aligned, E % 8 == 0).
    const bool aligned = reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
    launch_routing_octets(p, bf16, plan.octet_filter && aligned, counts, stream);
    return;
  }
  require(plan.kernel == RoutingKernel::SplitWarps,
          std::string("not a split routing kernel: ") + routing_kernel_name(plan.kernel));
  require(plan.split_blocks == ceil_div(params.num_tokens, kWarpsPerBlock),
          "the plan's blocks do not cover the tokens");
  if (bf16) {
    launch_for_type<uint16_t>(p, is_deepseek(p.policy), plan, stream);
  } else {
    launch_for_type<float>(p, is_deepseek(p.policy), plan, stream);
  }
}

void launch_routing_stage(const RoutingParams& routing, const PermuteParams& permute,
                          const RoutingPlan& plan, KernelStream stream) {
  if (plan.variant != RoutingVariant::Split) {
    launch_fused_routing_permute(routing, permute, plan, stream);
    return;
  }
  if (plan.kernel == RoutingKernel::None) return;
  if (permute.topk_ids != routing.topk_ids || permute.num_tokens != routing.num_tokens ||
      permute.top_k != routing.config.top_k)
    throw std::invalid_argument(
        "launch_routing_stage: the permute must take the routing's ids (the same topk_ids, T and "
        "K)");
  PermuteCounts counts;
  if (plan.routing_counts_rows) {
    counts = permute_counts(permute);
    require(counts.table != nullptr,
            "the plan has the octet kernel count the rows, but the permute scratch has no table "
            "(more than 2048 rows and 8-byte aligned scratch)");
  }
  launch_routing(routing, plan, stream, plan.routing_counts_rows ? &counts : nullptr);
}

void launch_permute_stage(const PermuteParams& permute, const RoutingPlan& plan,
                          KernelStream stream) {
  if (plan.variant != RoutingVariant::Split) return;  // the fused kinds permuted already
  launch_permute(permute, plan, stream);
}

void probe_routing_device_caps(const RoutingConfig& config, RoutingDeviceCaps& caps) {
  caps.sm_count = current_device_sm_count();
  probe_fused_routing_caps(config, caps);
}

}  // namespace unimoe
