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
// cluster of up to 8 (cluster_routing_ctas: a few tokens a CTA, since a CTA
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
// this file has the precomputed-ids kernel and the launchers.
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

// The cluster variant's minimum tokens a routing CTA
// (routing_shape::cluster_routing_ctas: at least this many tokens a CTA and
// at most a warp per token; beyond, the kernel routes on every CTA):
// routing_shape::cluster_min_tokens_by_default, given whether the call
// takes the wide kernels; UNIMOE_CLUSTER_MIN_TOKENS overrides it (for the
// sweep).
int cluster_min_tokens(bool deepseek, int num_experts, bool wide) {
  static const int forced = [] {
    const int v = env_int("UNIMOE_CLUSTER_MIN_TOKENS", INT_MIN);
    return v == INT_MIN ? 0 : std::max(1, v);
  }();
  return forced > 0 ? forced
                    : routing_shape::cluster_min_tokens_by_default(deepseek, num_experts, wide);
}

// The spread kernel's minimum tokens a CTA: as the cluster's (2 for the
// DeepSeek policies, 4 for the others) unless UNIMOE_SPREAD_MIN_TOKENS
// sets it (for the sweep).
int spread_min_tokens(bool deepseek) {
  static const int forced = env_int("UNIMOE_SPREAD_MIN_TOKENS", 0);
  return forced > 0 ? forced : routing_shape::default_spread_min_tokens(deepseek);
}

// The wide choice's kernels (kWide: DeepSeek policies, E = 64..512) are
// instantiated apart: holding its code cost the DeepSeek kernels' other
// paths 2-4% (session 19, run 8 against run 1: T = 16..128, where it never
// ran). The launcher takes them where a CTA of the launch seats its tokens
// (routing_shape::wide_fits, as the kernels decide it per CTA).
template <int kPerLane, bool kDeepSeek>
inline constexpr bool kHasWideKernels = kDeepSeek && kPerLane >= 2 && kPerLane <= 16;

// The cluster kernels whose routing CTAs compute DeepSeek's keys a warp a
// token (kDirectKeys, set_direct_keys) are instantiated apart as well, for
// E = 129..256 (8 slots a lane), where more than 1024 / E tokens a routing
// CTA would stage their keys in several batches: DeepSeekV3 E=256 from
// T=61 (13 routing CTAs of 5 tokens against 15 of 4 at T=60, the step of
// session 26's stamps). A batch's address arithmetic stood before each
// thread's first load: the keys were staged by cycle 2,517 against 1,228
// with one key a thread.
template <int kPerLane, bool kDeepSeek>
inline constexpr bool kHasDirectKeyKernels = kDeepSeek && kPerLane == 8;

// A routing kernel's type: the fused, cluster and spread kernels alike.
using RoutingKernel = void (*)(RoutingKernelParams, BlockPermuteParams);

// Whether the device runs `kernel` in clusters of `ctas` CTAs of `threads`
// threads: above the portable 8 the non-portable size allowed for it and
// for its `twins` (its wide and direct-keys twins, which run the same
// clusters; null where there is none), and at least one such cluster
// resident.
bool runs_clusters_of(RoutingKernel kernel, std::initializer_list<RoutingKernel> twins, int ctas,
                      int threads) {
  const auto allow = [](RoutingKernel k) {
    if (k == nullptr ||
        cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess)
      return true;
    cudaGetLastError();
    return false;
  };
  if (!allow(kernel)) return false;
  for (RoutingKernel twin : twins)
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

// The largest cluster of the spread kernel the device runs at the kernel's
// largest block: kSpreadMaxCtas (16, non-portable: the H200 runs 14 such
// clusters at once) where it runs one, else the portable 8. Asked once a
// kernel.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold>
int spread_device_max_ctas() {
  static const int largest = [] {
    RoutingKernel twin = nullptr;
    if constexpr (kHasWideKernels<kPerLane, kDeepSeek>)
      twin = spread_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
    return runs_clusters_of(spread_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>,
                            {twin}, routing_shape::kSpreadMaxCtas, fused_threads(kPerLane))
               ? routing_shape::kSpreadMaxCtas
               : kClusterMaxCtas;
  }();
  return largest;
}

WideChoice& wide_choice_setting() {
  static WideChoice setting = [] {
    const int v = env_int("UNIMOE_WIDE_CHOICE", -1);
    return v == 0 ? WideChoice::kOff : v == 1 ? WideChoice::kEverywhere : WideChoice::kMeasured;
  }();
  return setting;
}

// Whether the fixed choice runs (set_fixed_choice; UNIMOE_FIXED_CHOICE=0 at
// start turns it off).
bool& fixed_choice_setting() {
  static bool setting = env_switch_on("UNIMOE_FIXED_CHOICE");
  return setting;
}

// Whether the policies without groups at 4 slots a lane take the ranked
// threshold's kernels where threshold_serves (set_ranked_threshold;
// UNIMOE_RANKED_THRESHOLD=0 at start turns it off).
bool& ranked_threshold_setting() {
  static bool setting = env_switch_on("UNIMOE_RANKED_THRESHOLD");
  return setting;
}

// Whether this call's decode kernels take the fixed choice: where it
// serves, in the threshold kernels of 8 slots a lane that hold it
// (launch_routing_block takes them where threshold_serves).
bool takes_fixed_choice(const RoutingKernelParams& r) {
  return fixed_choice_setting() && is_deepseek(r.policy) &&
         routing_shape::fixed_choice_serves(r.num_experts, r.n_group, r.topk_group, r.top_k) &&
         routing_shape::threshold_serves(r.top_k, slots_per_lane(r.num_experts), true,
                                         r.topk_group, r.experts_per_group);
}

// The wide choice's parts a token for this call (0: off), as
// wide_choice_setting says; by default none where the fixed choice runs.
int wide_parts_for(const RoutingKernelParams& r) {
  const WideChoice setting = wide_choice_setting();
  if (setting == WideChoice::kOff || !is_deepseek(r.policy)) return 0;
  if (setting == WideChoice::kMeasured && r.fixed_choice != 0) return 0;
  const int parts = routing_shape::wide_parts(r.num_experts, r.n_group, r.experts_per_group);
  return setting == WideChoice::kEverywhere || routing_shape::wide_by_default(parts, r.top_k)
             ? parts
             : 0;
}

ClusterSpread& spread_setting() {
  static ClusterSpread setting{env_switch_on("UNIMOE_CLUSTER_SPREAD"),
                               std::max(0, env_int("UNIMOE_SPREAD_MAX_CTAS", 0)),
                               std::max(0, env_int("UNIMOE_SPREAD_FROM_TOKENS", 0))};
  return setting;
}

// Whether 33..64 rows take the one-warp sort of two keys a lane
// (set_sorted_pair; UNIMOE_SORTED_PAIR=0 at start turns it off).
bool& sorted_pair_setting() {
  static bool setting = env_switch_on("UNIMOE_SORTED_PAIR");
  return setting;
}

// Whether the cluster kernel takes its direct-keys twin where it has one
// and the routing CTAs would stage keys in batches (set_direct_keys;
// UNIMOE_DIRECT_KEYS=0 at start turns it off).
bool& direct_keys_setting() {
  static bool setting = env_switch_on("UNIMOE_DIRECT_KEYS");
  return setting;
}

// The cluster kernel's largest cluster as set (set_cluster_max_ctas; 0:
// routing_shape::cluster_max_ctas_by_default).
int& cluster_max_ctas_setting() {
  static int setting = [] {
    const int v = env_int("UNIMOE_CLUSTER_MAX_CTAS", 0);
    return v >= 2 ? std::min(v, routing_shape::kClusterMaxCtasNonPortable) : 0;
  }();
  return setting;
}

// Whether the device runs this cluster kernel (and its wide and
// direct-keys twins) in clusters of routing_shape::kClusterMaxCtasNonPortable
// at its largest block. Asked once a kernel.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold>
bool cluster_runs_large() {
  static const bool runs = [] {
    RoutingKernel wide = nullptr, direct = nullptr;
    if constexpr (kHasWideKernels<kPerLane, kDeepSeek>)
      wide = cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
    if constexpr (kHasDirectKeyKernels<kPerLane, kDeepSeek>)
      direct = cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold, false, true>;
    return runs_clusters_of(cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>,
                            {wide, direct}, routing_shape::kClusterMaxCtasNonPortable,
                            fused_threads(kPerLane));
  }();
  return runs;
}

// The cluster kernel's largest cluster for a call: as set, else the
// measured rule; at most kClusterMaxCtas where the device does not run the
// kernel in larger clusters.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold>
int cluster_max_ctas_for(int num_experts) {
  const int set = cluster_max_ctas_setting();
  const int wanted =
      set > 0 ? set : routing_shape::cluster_max_ctas_by_default(kDeepSeek, num_experts);
  if (wanted <= kClusterMaxCtas) return wanted;
  return cluster_runs_large<LogitT, kPerLane, kDeepSeek, kThreshold>() ? wanted : kClusterMaxCtas;
}

// The single block's decode way (weights_beside_permute, on the host) with
// the wide choice seating its T tokens.
bool block_takes_wide(const RoutingKernelParams& r, const BlockPermuteParams& p, int threads) {
  const int warps = threads / kWarpSize;
  return p.wide_parts > 0 && p.rows <= kWarpSize && r.num_tokens < warps &&
         r.num_tokens * r.num_experts <= kWorkWords &&
         routing_shape::wide_fits(r.num_tokens, p.wide_parts, warps,
                                  routing_shape::kWideMaxTokensBlock);
}

template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold>
void launch_width(const RoutingKernelParams& r, const BlockPermuteParams& p, bool cluster,
                  cudaStream_t stream) {
  // Each launch below takes kernel<..., kThreshold> or, where the wide
  // choice seats its tokens and the wide kernels exist, kernel<..., false,
  // true> (a CTA of it that does not seat its tokens takes the rounds, with
  // the same outputs).
  constexpr bool kHasWide = kHasWideKernels<kPerLane, kDeepSeek>;
  const ClusterSpread spread = spread_setting();
  // The CTA-0 kernel's largest cluster for the call (its routing CTAs'
  // tokens also set where the spread kernel takes over).
  const int cluster_ctas =
      cluster ? cluster_max_ctas_for<LogitT, kPerLane, kDeepSeek, kThreshold>(r.num_experts)
              : kClusterMaxCtas;
  if (cluster && spread.on) {
    const auto kernel = spread_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>;
    const int device_max = spread_device_max_ctas<LogitT, kPerLane, kDeepSeek, kThreshold>();
    const int max_ctas = spread.max_ctas > 0 ? std::min(spread.max_ctas, device_max) : device_max;
    const routing_shape::SpreadShape shape =
        routing_shape::spread_shape(kPerLane, r.num_tokens, p.num_local, r.num_experts, kDeepSeek,
                                    spread_min_tokens(kDeepSeek), max_ctas);
    // A set threshold (tests, sweeps) replaces the measured defaults.
    const bool take = spread.from_tokens > 0
                          ? shape.ctas > 0 && r.num_tokens >= spread.from_tokens
                          : routing_shape::spread_by_default(shape, r.num_tokens, r.top_k,
                                                             p.num_local, r.num_experts, kDeepSeek,
                                                             cluster_ctas);
    if (take) {
      BlockPermuteParams q = for_block(p, shape.permute_threads);
      q.tokens_per_cta = shape.tokens_per_cta;
      const bool wide =
          p.wide_parts > 0 && routing_shape::wide_fits(shape.tokens_per_cta, p.wide_parts,
                                                       shape.threads / kWarpSize,
                                                       routing_shape::kWideMaxTokensCluster);
      auto chosen = kernel;
      if constexpr (kHasWide) {
        if (wide) chosen = spread_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
      }
      launch_pdl_clustered(chosen, shape.ctas, shape.threads, 0, shape.ctas, stream, r, q);
      return;
    }
  }
  const routing_shape::LaunchShape shape = routing_shape::launch_shape(
      kPerLane, r.num_tokens, p.num_local, r.num_experts, kDeepSeek, cluster,
      cluster ? cluster_min_tokens(kDeepSeek, r.num_experts, kHasWide && p.wide_parts > 0) : 1,
      cluster_ctas);
  if (shape.routing_ctas == 1 &&
      !(cluster && routing_shape::cluster_of_two_for_one_cta(kDeepSeek, r.num_experts))) {
    auto kernel = fused_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>;
    if constexpr (kHasWide) {
      if (block_takes_wide(r, p, shape.threads))
        kernel = fused_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
    }
    launch_pdl(kernel, 1, shape.threads, 0, stream, r, for_block(p, shape.threads));
    return;
  }
  // One cluster: CTA 0 permutes, the others route (and CTA 0 too, where
  // the routing CTAs have fewer warps than tokens: shape.overlapped false).
  const int ctas = shape.routing_ctas + 1;
  BlockPermuteParams q = for_block(p, shape.threads);
  q.tokens_per_routing_cta = routing_shape::tokens_per_routing_cta(r.num_tokens, ctas);
  q.tokens_per_cta = routing_shape::tokens_per_cta(r.num_tokens, ctas);
  const bool wide = p.wide_parts > 0 && shape.overlapped &&
                    routing_shape::wide_fits(q.tokens_per_routing_cta, p.wide_parts,
                                             shape.threads / kWarpSize,
                                             routing_shape::kWideMaxTokensCluster);
  auto kernel = cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>;
  if constexpr (kHasWide) {
    if (wide) kernel = cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
  }
  if constexpr (kHasDirectKeyKernels<kPerLane, kDeepSeek>) {
    const bool batched_keys =
        shape.overlapped && q.tokens_per_routing_cta * r.num_experts > shape.threads;
    if (!wide && batched_keys && direct_keys_setting())
      kernel = cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold, false, true>;
  }
  launch_pdl_clustered(kernel, ctas, shape.threads, 0, ctas, stream, r, q);
}

template <typename LogitT, bool kDeepSeek>
void launch_routing_block(const RoutingKernelParams& r, const BlockPermuteParams& p, bool cluster,
                          cudaStream_t stream) {
  with_slots_per_lane(r.num_experts, [&](auto slots) {
    constexpr int kPerLane = decltype(slots)::value;
    if constexpr (kPerLane >= kThresholdMinSlots || (kPerLane == kRankedSlots && !kDeepSeek)) {
      // The ranked threshold's kernels leave the sorted pair out, as the
      // other threshold kernels of the policies without groups do
      // (kHoldsSortedPair): 33..64 rows, where the pair runs, keep the
      // rounds' kernels, which hold it.
      const bool pair_runs = p.sorted_pair && p.rows > kWarpSize && p.rows <= 2 * kWarpSize;
      const bool ranked_off =
          kPerLane == kRankedSlots && (pair_runs || !ranked_threshold_setting());
      if (!ranked_off && routing_shape::threshold_serves(r.top_k, kPerLane, kDeepSeek,
                                                        r.topk_group, r.experts_per_group)) {
        launch_width<LogitT, kPerLane, kDeepSeek, true>(r, p, cluster, stream);
        return;
      }
    }
    launch_width<LogitT, kPerLane, kDeepSeek, false>(r, p, cluster, stream);
  });
}

template <typename LogitT>
void launch_for_type(const RoutingKernelParams& r, const BlockPermuteParams& p, bool cluster,
                     cudaStream_t stream) {
  if (is_deepseek(r.policy)) {
    launch_routing_block<LogitT, true>(r, p, cluster, stream);
  } else {
    launch_routing_block<LogitT, false>(r, p, cluster, stream);
  }
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("launch_fused_routing_permute: " + message);
}

}  // namespace

bool fused_routing_fits(int num_tokens, int top_k, int num_local) {
  return num_tokens >= 0 && top_k >= 1 && num_local >= 1 && num_local <= kFusedMaxLocalExperts &&
         static_cast<long long>(num_tokens) * top_k <= kFusedMaxRows;
}

namespace {

void launch_block_or_cluster(const RoutingParams& routing, const PermuteParams& permute,
                             bool cluster, cudaStream_t stream) {
  const bool route = routing.logits != nullptr;
  require(fused_routing_fits(permute.num_tokens, permute.top_k, permute.num_local),
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
  p.sorted_pair = sorted_pair_setting();

  if (!route || rows == 0) {
    launch_pdl(fused_permute_kernel, 1, kMaxThreads, 0, stream, for_block(p, kMaxThreads));
  } else {
    RoutingKernelParams r = make_routing_kernel_params(routing);
    r.fixed_choice = takes_fixed_choice(r) ? 1 : 0;
    p.wide_parts = static_cast<uint8_t>(wide_parts_for(r));
    p.wide_floor_rank = static_cast<uint8_t>(
        routing_shape::wide_floor_rank(r.top_k, p.wide_parts, r.n_group, r.topk_group));
    if (routing.config.logits_type == LogitsType::BF16) {
      launch_for_type<uint16_t>(r, p, cluster, stream);
    } else {
      launch_for_type<float>(r, p, cluster, stream);
    }
  }
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace

void launch_fused_routing_permute(const RoutingParams& routing, const PermuteParams& permute,
                                  cudaStream_t stream) {
  launch_block_or_cluster(routing, permute, false, stream);
}

void launch_cluster_routing_permute(const RoutingParams& routing, const PermuteParams& permute,
                                    cudaStream_t stream) {
  launch_block_or_cluster(routing, permute, true, stream);
}

ClusterSpread cluster_spread() { return spread_setting(); }

WideChoice wide_choice() { return wide_choice_setting(); }

void set_wide_choice(WideChoice setting) { wide_choice_setting() = setting; }

int cluster_max_ctas() { return cluster_max_ctas_setting(); }

void set_cluster_max_ctas(int max_ctas) {
  if (max_ctas < 0 || max_ctas == 1 || max_ctas > routing_shape::kClusterMaxCtasNonPortable)
    throw std::invalid_argument(
        "set_cluster_max_ctas: max_ctas must be 0 (the measured rule) or 2.." +
        std::to_string(routing_shape::kClusterMaxCtasNonPortable) + "; got " +
        std::to_string(max_ctas));
  cluster_max_ctas_setting() = max_ctas;
}

bool direct_keys() { return direct_keys_setting(); }

void set_direct_keys(bool on) { direct_keys_setting() = on; }

bool fixed_choice() { return fixed_choice_setting(); }

void set_fixed_choice(bool on) { fixed_choice_setting() = on; }

bool ranked_threshold() { return ranked_threshold_setting(); }

void set_ranked_threshold(bool on) { ranked_threshold_setting() = on; }

bool sorted_pair() { return sorted_pair_setting(); }

void set_sorted_pair(bool on) { sorted_pair_setting() = on; }

void set_cluster_spread(ClusterSpread setting) {
  if (setting.from_tokens < 0)
    throw std::invalid_argument("set_cluster_spread: from_tokens must be >= 0; got " +
                                std::to_string(setting.from_tokens));
  if (setting.max_ctas < 0 || setting.max_ctas == 1 || setting.max_ctas > routing_shape::kSpreadMaxCtas)
    throw std::invalid_argument("set_cluster_spread: max_ctas must be 0 (the device's largest) or 2.." +
                                std::to_string(routing_shape::kSpreadMaxCtas) + "; got " +
                                std::to_string(setting.max_ctas));
  spread_setting() = setting;
}

}  // namespace unimoe
