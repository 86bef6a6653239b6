// Routing + sort/permute in one block (contract: fused_routing.cuh). The
// block runs four phases, separated by __syncthreads:
//   1. route: warp w routes tokens w, w + warps, ... with routing.cu's
//      per-token code (routing_device.cuh) and stages each expanded row's
//      local expert in shared memory (precomputed mode stages the given ids);
//   2. count: scatter warp w takes the w-th contiguous span of expanded rows,
//      32 rows a piece in order, and counts its rows per expert
//      (__match_any_sync: the lowest lane of equal experts adds, no atomics);
//   3. scan: expert totals -> counts and offsets, and each (warp, expert)'s
//      first permuted row;
//   4. scatter and tiles: each row goes to its warp's cursor plus its rank
//      among the piece's lanes of the same expert, so the rows of an expert
//      stay in increasing expanded index (the stable order of ref::permute);
//      then every tile schedule, a thread per tile.
// One 32 KB work area serves, in turn, the warps' group keys (DeepSeek: the
// block's selection keys of as many tokens as fit, an expert a thread, which
// the warps then read), the per-warp cursors and the tile bases. Up to 32
// rows (decode), phases 2-4 take a short path with at most one barrier
// (permute_piece); beyond, routed rows place by per-expert token masks
// where they fit the work area (permute_by_token_masks; 33..64 rows by one
// warp's sort, permute_sorted_pair), other inputs by
// the general phases above. The routing kernels let the next kernel launch
// at once (pdl_launch_dependents): its CTAs wait for this one's end on the
// otherwise idle SMs.
//
// The cluster variant spreads phase 1 over the CTAs 1.. of a thread-block
// cluster of up to 16 (cluster_routing_ctas: a few tokens a CTA, since a CTA
// of many routing warps gets slower with its size): routing CTA c takes a
// contiguous run of tokens, a warp a token (DeepSeek policies: it stages
// the run's keys), and stages each row's expert straight into CTA 0's
// shared memory (distributed shared memory). CTA 0 routes nothing: after the
// cluster barrier it alone runs phases 2-4, unchanged, while the routing
// CTAs weigh their experts. Where those CTAs would need more warps than
// they have (large T), every CTA routes whole tokens, CTA 0 too, before the
// barrier.
//
// The kernels live in headers, one part each: parameters and shared memory
// (fused_routing_shared.cuh), phases 2-4 (block_permute_piece.cuh up to 32
// rows, block_permute.cuh), the fused and cluster kernels
// (fused_routing_kernels.cuh), the spread kernel (spread_routing_kernel.cuh);
// this file has the precomputed-ids kernel, the launcher, which launches
// what the routing plan (plan/routing_plan.h) names and decides nothing,
// and the probe of the cluster sizes the device runs.
#include <cooperative_groups.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "core/exact_quotient.h"
#include "core/routing_launch_shape.h"
#include "kernels/common/common.cuh"
#include "kernels/routing/fused_routing.cuh"
#include "kernels/routing/fused_routing_kernels.cuh"
#include "kernels/routing/spread_routing_kernel.cuh"

namespace unimoe {
namespace {

using namespace fused_detail;

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("launch_fused_routing_permute: " + message);
}

// Precomputed ids, or no tokens: phases 2-4 only.
__global__ void __launch_bounds__(kMaxThreads, 1)
    fused_permute_kernel(const __grid_constant__ BlockPermuteParams p) {
  pdl_begin();
  pdl_launch_dependents();
  __shared__ BlockShared s;
  for (int i = threadIdx.x; i < p.rows; i += blockDim.x)
    s.expert[i] = local_expert(p.topk_ids[i], p);
  __syncthreads();
  permute_block(p, s);
}

// The wide choice's kernels (kWide: DeepSeek policies, E = 64..512) are
// instantiated apart: holding its code cost the DeepSeek kernels' other
// paths 2-4% at T = 16..128, where it never runs (measured on an H200).
// The plan takes them where a CTA of the launch seats its tokens
// (routing_shape::wide_fits, as the kernels decide it per CTA).
template <int kPerLane, bool kDeepSeek>
inline constexpr bool kHasWideKernels = kDeepSeek && kPerLane >= 2 && kPerLane <= 16;

// The cluster kernels whose routing CTAs compute DeepSeek's keys a warp a
// token (kDirectKeys, the plan's direct_keys_kernel) are instantiated apart as well, for
// E = 129..256 (8 slots a lane), where more than 1024 / E tokens a routing
// CTA would stage their keys in several batches: DeepSeekV3 E=256 from
// T=61 (13 routing CTAs of 5 tokens against 15 of 4 at T=60, the step of
// phase stamps measured on an H200). A batch's address arithmetic stood before each
// thread's first load: the keys were staged by cycle 2,517 against 1,228
// with one key a thread.
template <int kPerLane, bool kDeepSeek>
inline constexpr bool kHasDirectKeyKernels = kDeepSeek && kPerLane == 8;

// A routing kernel's type: the fused, cluster and spread kernels alike.
using RoutingKernelFn = void (*)(RoutingKernelParams, BlockPermuteParams);

// Whether the device runs `kernel` in clusters of `ctas` CTAs of `threads`
// threads: above the portable 8 the non-portable size allowed for it and
// for its `twins` (its wide and direct-keys twins, which run the same
// clusters; null where there is none), and at least one such cluster
// resident.
bool runs_clusters_of(RoutingKernelFn kernel, std::initializer_list<RoutingKernelFn> twins, int ctas,
                      int threads) {
  const auto allow = [](RoutingKernelFn k) {
    if (k == nullptr ||
        cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess)
      return true;
    cudaGetLastError();
    return false;
  };
  if (!allow(kernel)) return false;
  for (RoutingKernelFn twin : twins)
    if (!allow(twin)) return false;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = ctas;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = ctas;
  config.blockDim = threads;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return clusters >= 1;
}

// Whether the device runs the spread kernel (and its wide twin) in
// clusters of kSpreadMaxCtas (16, non-portable: the H200 runs 14 such
// clusters at once) at the kernel's largest block.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold>
bool spread_runs_large() {
  RoutingKernelFn twin = nullptr;
  if constexpr (kHasWideKernels<kPerLane, kDeepSeek>)
    twin = spread_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
  return runs_clusters_of(spread_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>,
                          {twin}, routing_shape::kSpreadMaxCtas, fused_threads(kPerLane));
}

// Whether the device runs this cluster kernel (and its wide and
// direct-keys twins) in clusters of routing_shape::kClusterMaxCtasNonPortable
// at its largest block.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold>
bool cluster_runs_large() {
  RoutingKernelFn wide = nullptr, direct = nullptr;
  if constexpr (kHasWideKernels<kPerLane, kDeepSeek>)
    wide = cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
  if constexpr (kHasDirectKeyKernels<kPerLane, kDeepSeek>)
    direct = cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold, false, true>;
  return runs_clusters_of(cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>,
                          {wide, direct}, routing_shape::kClusterMaxCtasNonPortable,
                          fused_threads(kPerLane));
}

template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold>
void launch_planned(const RoutingKernelParams& r, const BlockPermuteParams& p,
                    const RoutingPlan& plan, KernelStream stream) {
  // Each launch takes kernel<..., kThreshold> or, where the plan takes the
  // wide choice, kernel<..., false, true> (a CTA of it that does not seat
  // its tokens takes the rounds, with the same outputs), or the cluster
  // kernel's direct-keys twin kernel<..., kThreshold, false, true>.
  constexpr bool kHasWide = kHasWideKernels<kPerLane, kDeepSeek>;
  constexpr bool kHasDirect = kHasDirectKeyKernels<kPerLane, kDeepSeek>;
  require(!plan.wide_kernel || kHasWide, "the plan takes a wide kernel this config has not");
  require(!plan.direct_keys_kernel || kHasDirect,
          "the plan takes a direct-keys kernel this config has not");
  switch (plan.kernel) {
    case RoutingKernel::Spread: {
      BlockPermuteParams q = for_block(p, plan.permute_threads);
      q.tokens_per_cta = plan.tokens_per_cta;
      auto kernel = spread_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>;
      if constexpr (kHasWide) {
        if (plan.wide_kernel)
          kernel = spread_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
      }
      launch_pdl_clustered(kernel, plan.ctas, plan.threads, 0, plan.ctas, stream, r, q);
      return;
    }
    case RoutingKernel::Block: {
      auto kernel = fused_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>;
      if constexpr (kHasWide) {
        if (plan.wide_kernel)
          kernel = fused_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
      }
      launch_pdl(kernel, 1, plan.threads, 0, stream, r, for_block(p, plan.threads));
      return;
    }
    case RoutingKernel::Cluster: {
      // One cluster: CTA 0 permutes, the others route (and CTA 0 too, where
      // the routing CTAs have fewer warps than tokens).
      BlockPermuteParams q = for_block(p, plan.threads);
      q.tokens_per_routing_cta = plan.tokens_per_routing_cta;
      q.tokens_per_cta = plan.tokens_per_cta;
      auto kernel = cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>;
      if constexpr (kHasWide) {
        if (plan.wide_kernel)
          kernel = cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
      }
      if constexpr (kHasDirect) {
        if (plan.direct_keys_kernel)
          kernel =
              cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold, false, true>;
      }
      launch_pdl_clustered(kernel, plan.ctas, plan.threads, 0, plan.ctas, stream, r, q);
      return;
    }
    default: require(false, std::string("not a routing kernel of this launcher: ") +
                                routing_kernel_name(plan.kernel));
  }
}

// Whether kernel<..., true> (the threshold selection) is built for these
// slots: at kThresholdMinSlots and more, and the ranked threshold at
// kRankedSlots for the policies without groups.
template <int kPerLane, bool kDeepSeek>
inline constexpr bool kHasThresholdKernels =
    kPerLane >= kThresholdMinSlots || (kPerLane == kRankedSlots && !kDeepSeek);

template <typename LogitT, bool kDeepSeek>
void launch_routing_block(const RoutingKernelParams& r, const BlockPermuteParams& p,
                          const RoutingPlan& plan, KernelStream stream) {
  with_slots_per_lane(r.num_experts, [&](auto slots) {
    constexpr int kPerLane = decltype(slots)::value;
    require(plan.slots == kPerLane, "the plan's slots a lane do not match num_experts");
    if constexpr (kHasThresholdKernels<kPerLane, kDeepSeek>) {
      if (plan.threshold_kernel) {
        launch_planned<LogitT, kPerLane, kDeepSeek, true>(r, p, plan, stream);
        return;
      }
    }
    require(!plan.threshold_kernel, "the plan takes a threshold kernel this config has not");
    launch_planned<LogitT, kPerLane, kDeepSeek, false>(r, p, plan, stream);
  });
}

template <typename LogitT>
void launch_for_type(const RoutingKernelParams& r, const BlockPermuteParams& p,
                     const RoutingPlan& plan, KernelStream stream) {
  if (is_deepseek(r.policy)) {
    launch_routing_block<LogitT, true>(r, p, plan, stream);
  } else {
    launch_routing_block<LogitT, false>(r, p, plan, stream);
  }
}

// The config's cluster and spread kernels, for the probe: those of either
// selection its slots are built with.
template <typename LogitT, bool kDeepSeek>
void probe_kernels(int num_experts, RoutingDeviceCaps& caps) {
  with_slots_per_lane(num_experts, [&](auto slots) {
    constexpr int kPerLane = decltype(slots)::value;
    caps.cluster_runs_16[0] = caps.cluster_runs_16[1] =
        cluster_runs_large<LogitT, kPerLane, kDeepSeek, false>();
    caps.spread_runs_16[0] = caps.spread_runs_16[1] =
        spread_runs_large<LogitT, kPerLane, kDeepSeek, false>();
    if constexpr (kHasThresholdKernels<kPerLane, kDeepSeek>) {
      caps.cluster_runs_16[1] = cluster_runs_large<LogitT, kPerLane, kDeepSeek, true>();
      caps.spread_runs_16[1] = spread_runs_large<LogitT, kPerLane, kDeepSeek, true>();
    }
  });
}

}  // namespace

void launch_fused_routing_permute(const RoutingParams& routing, const PermuteParams& permute,
                                  const RoutingPlan& plan, KernelStream stream) {
  const bool route = routing.logits != nullptr;
  require(routing_limits::fused_routing_fits(permute.num_tokens, permute.top_k, permute.num_local),
          "needs num_tokens >= 0, top_k >= 1, num_tokens * top_k <= " +
              std::to_string(kFusedMaxRows) + " and num_local 1.." +
              std::to_string(kFusedMaxLocalExperts) + "; got T=" +
              std::to_string(permute.num_tokens) + " K=" + std::to_string(permute.top_k) +
              " num_local=" + std::to_string(permute.num_local));
  require(permute.local_offset >= 0, "local_offset must be >= 0");
  require(permute.num_tile_sizes >= 0 && permute.num_tile_sizes <= kMaxTileSizes,
          "num_tile_sizes must be 0.." + std::to_string(kMaxTileSizes));
  for (int s = 0; s < permute.num_tile_sizes; ++s)
    require(permute.tile_m[s] > 0 && permute.tiles[s] != nullptr && permute.num_tiles[s] != nullptr,
            "each tile size needs tile_m > 0, tiles and num_tiles");
  require(permute.expert_counts != nullptr && permute.expert_offsets != nullptr,
          "expert_counts and expert_offsets must be set");
  const int rows = permute.num_tokens * permute.top_k;
  require(rows == 0 || (permute.permuted_to_expanded != nullptr &&
                        permute.expanded_to_permuted != nullptr),
          "permuted_to_expanded and expanded_to_permuted must be set");
  if (route) {
    check_routing_config(routing, "launch_fused_routing_permute");
    require(routing.num_tokens == permute.num_tokens && routing.config.top_k == permute.top_k,
            "routing and permute disagree on num_tokens or top_k");
    require(permute.topk_ids == nullptr || permute.topk_ids == routing.topk_ids,
            "with logits, permute.topk_ids must be null or routing.topk_ids");
    require(rows == 0 || (routing.topk_ids != nullptr && routing.topk_weights != nullptr),
            "topk_ids and topk_weights must be set");
  } else {
    require(rows == 0 || permute.topk_ids != nullptr,
            "without logits (precomputed ids), permute.topk_ids must be set");
  }

  require(plan.variant != RoutingVariant::Split, "the plan takes the split chain");
  require((plan.kernel == RoutingKernel::PermuteOnly) == (!route || rows == 0),
          std::string("the plan's kernel (") + routing_kernel_name(plan.kernel) +
              ") does not match the call (ids given, or no rows, take permute_only)");

  BlockPermuteParams p{};
  p.topk_ids = route ? nullptr : permute.topk_ids;
  p.rows = rows;
  p.top_k = permute.top_k;
  p.distinct_per_token = route;
  p.local_offset = permute.local_offset;
  p.num_local = permute.num_local;
  p.expert_counts = permute.expert_counts;
  p.expert_offsets = permute.expert_offsets;
  p.permuted_to_expanded = permute.permuted_to_expanded;
  p.expanded_to_permuted = permute.expanded_to_permuted;
  p.num_tile_sizes = permute.num_tile_sizes;
  for (int s = 0; s < permute.num_tile_sizes; ++s) {
    p.tile_m[s] = permute.tile_m[s];
    p.inv_tile_m[s] = inverse_of(permute.tile_m[s]);
    p.tiles[s] = permute.tiles[s];
    p.num_tiles[s] = permute.num_tiles[s];
  }
  p.inv_top_k = inverse_of(permute.top_k);
  p.sorted_pair = plan.sorted_pair;

  if (plan.kernel == RoutingKernel::PermuteOnly) {
    launch_pdl(fused_permute_kernel, 1, kMaxThreads, 0, stream, for_block(p, kMaxThreads));
  } else {
    RoutingKernelParams r = make_routing_kernel_params(routing);
    r.fixed_choice = plan.fixed_choice ? 1 : 0;
    p.wide_parts = static_cast<uint8_t>(plan.wide_parts);
    p.wide_floor_rank = static_cast<uint8_t>(plan.wide_floor_rank);
    if (routing.config.logits_type == LogitsType::BF16) {
      launch_for_type<uint16_t>(r, p, plan, stream);
    } else {
      launch_for_type<float>(r, p, plan, stream);
    }
  }
  UNIMOE_LAUNCH_CHECK();
}

void probe_fused_routing_caps(const RoutingConfig& config, RoutingDeviceCaps& caps) {
  const bool deepseek = is_deepseek(config.policy);
  if (config.logits_type == LogitsType::BF16) {
    deepseek ? probe_kernels<uint16_t, true>(config.num_experts, caps)
             : probe_kernels<uint16_t, false>(config.num_experts, caps);
  } else {
    deepseek ? probe_kernels<float, true>(config.num_experts, caps)
             : probe_kernels<float, false>(config.num_experts, caps);
  }
}

}  // namespace unimoe
