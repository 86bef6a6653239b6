// The fused and cluster routing kernels (the family: fused_routing.cu):
// phase 1 (fused_routing_tokens.cuh: a token's experts chosen by a warp or,
// where it serves, by the wide choice), then phases 2-4 (block_permute.cuh)
// in the single block, or in CTA 0 of a cluster while the other CTAs route.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/permute/block_permute.cuh"
#include "kernels/common/cluster_handoff.cuh"
#include "kernels/common/common.cuh"
#include "kernels/routing/routing_fixed.cuh"
#include "kernels/routing/fused_routing_tokens.cuh"

namespace unimoe::fused_detail {

template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold, bool kWide = false>
__global__ void __launch_bounds__(fused_threads(kPerLane), 1)
    fused_routing_permute_kernel(const __grid_constant__ RoutingKernelParams r,
                                 const __grid_constant__ BlockPermuteParams p) {
  __shared__ BlockShared s;
  phase_stamp(s, 0, threadIdx.x == 0);
  clear_stamps(s);
  warm_params(r, p, s);
  pdl_begin();
  pdl_launch_dependents();
  phase_stamp(s, 1, threadIdx.x == 0);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  if (weights_beside_permute(r, p, kDeepSeek)) {  // uniform
    route_then_permute<LogitT, kPerLane, kDeepSeek, kThreshold, kWide>(r, p, s, lane, warp);
    print_stamps(s, "beside", r, 0, 1);
    return;
  }
  if constexpr (kDeepSeek) {
    route_deepseek_tokens<LogitT, kPerLane, kThreshold>(r, p, s, s.expert, 0, r.num_tokens);
  } else {
    float* group_keys = s.work.keys + warp * kPerLane * kWarpSize;
    route_tokens<LogitT, kPerLane, false, false, kThreshold>(r, p, group_keys, s.expert, lane, 0,
                                                             r.num_tokens, warp, warps);
  }
  phase_stamp(s, 3, threadIdx.x == 0);
  __syncthreads();
  phase_stamp(s, 5, threadIdx.x == 0);
  permute_block<kHoldsSortedPair<kDeepSeek, kThreshold>>(p, s);
  phase_stamp(s, 7, threadIdx.x == 0);
  print_stamps(s, "block", r, 0, 1);
}

// The overlapped cluster kernel's handoff of the staged rows to CTA 0, in
// place of a cluster barrier (whose arrive, a release, waited on a GPU-scope
// memory barrier in every routing thread): CTA 0 expects the rows' bytes on
// an mbarrier in its shared memory, the routing lanes store them there
// asynchronously (st.async, or red.async where two tokens share a word), and
// CTA 0's threads wait for the mbarrier's phase.
// Opening (every thread of every CTA, before pdl_begin): CTA 0's thread 0
// initializes the mbarrier and arrives on it expecting the bytes; at odd K
// CTA 0 zeroes the staged words (two tokens' rows can share one, which both
// then or into); every thread arrives at the cluster barrier, CTA 0's with
// release. A routing CTA waits at that barrier before its first store; CTA 0
// waits at it too, then on the mbarrier.
// Bytes: a 32-bit word a row pair at even K (one store a pair), a word a row
// at odd K (an or a row).
// Measured on an H200 (against the cluster barrier, two builds on the same
// machine): the cluster variant 0.95-0.96 at T = 5..16, 0.93-0.95 at 17..64
// and 0.95-0.96 at 65..256 by geometric mean (the policies without groups
// 0.978-0.98 at T <= 4, DeepSeek 0.995-1.005 at T=1); Renormalize E=128 K=8
// T=64 3.13 -> 2.92 us, T=48 2.96 -> 2.71; DeepSeekV3 E=256 K=8 T=64
// 3.88 -> 3.66.
// With the cluster barrier, the phase stamps put CTA 0 past it 430-730 cycles
// after the routing CTAs chose (bench/results/h200/routing-phase-stamps.txt).
__device__ __forceinline__ uint32_t handoff_bytes(int rows, int top_k) {
  return static_cast<uint32_t>((top_k & 1) ? rows * 4 : rows * 2);
}

__device__ __forceinline__ void open_row_handoff(const BlockPermuteParams& p, BlockShared& s,
                                                 bool receiver) {
  if (!receiver) {
    cluster_arrive_relaxed();
    return;
  }
  if (threadIdx.x == 0) {
    handoff_init(&s.handoff, 1);
    handoff_expect_bytes(&s.handoff, handoff_bytes(p.rows, p.top_k));
  }
  if (p.top_k & 1) {
    uint32_t* words = reinterpret_cast<uint32_t*>(s.expert);
#pragma unroll 1
    for (int i = threadIdx.x; i < (p.rows + 1) / 2; i += blockDim.x) words[i] = 0u;
  }
  cluster_arrive_release();
}

// A routing warp's rows of `token` (lane k < K holds its k-th row's local
// expert, -1 off rank) into CTA 0's s.expert; every lane calls it.
__device__ __forceinline__ void hand_off_rows(int top_k, int token, int lane, int expert,
                                              BlockShared& s) {
  const uint32_t mine = static_cast<uint16_t>(expert);
  const uint32_t next = __shfl_down_sync(kFullMask, mine, 1);
  const int row = token * top_k + lane;
  const uint32_t word = cluster_address(s.expert, 0) + static_cast<uint32_t>(row & ~1) * 2u;
  const uint32_t bar = cluster_address(&s.handoff, 0);
  if (lane >= top_k) return;
  if ((top_k & 1) == 0) {
    if ((lane & 1) == 0) store_async_remote(word, mine | next << 16, bar);
  } else {
    or_async_remote(word, mine << (16 * (row & 1)), bar);
  }
}

// The cluster variant (launched with a cluster of gridDim.x CTAs), two
// ways:
//   - overlapped, where the CTAs 1.. take every token with a warp each
//     (and, DeepSeek, stage all their tokens' keys at once: up to
//     kWorkWords / E tokens, 32 at E = 256): CTA 0 routes no token, so that
//     the routing CTAs weigh their experts while it permutes. They hand
//     each row's expert to CTA 0's shared memory by asynchronous stores
//     (open_row_handoff, hand_off_rows) and only then weigh; CTA 0 waits
//     on the stores' mbarrier and permutes.
//   - otherwise (large T), every CTA, CTA 0 too, routes a run of tokens
//     whole (experts and weights) before the barrier, and CTA 0 then
//     permutes: more CTAs route, each warp fewer tokens.
// Every thread arrives at the cluster barrier and waits on it once, twice in
// the whole way: first (arriving before the wait for the previous grid) so
// that no CTA stores into CTA 0's shared memory before CTA 0 has started,
// which compute-sanitizer's racecheck reports otherwise, then to publish
// the rows.
// kDirectKeys (DeepSeek, taken by the launcher where the overlapped way's
// routing CTAs would stage more keys than they have threads, the routing
// plan's direct keys): each routing warp computes its token's keys itself
// instead of the block staging them in batches.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold, bool kWide = false,
          bool kDirectKeys = false>
__global__ void __launch_bounds__(fused_threads(kPerLane), 1)
    cluster_routing_permute_kernel(const __grid_constant__ RoutingKernelParams r,
                                   const __grid_constant__ BlockPermuteParams p) {
  static_assert(!kDirectKeys || (kDeepSeek && !kWide),
                "direct keys: DeepSeek kernels, not the wide choice's");
  __shared__ BlockShared s;
  phase_stamp(s, 0, threadIdx.x == 0);
  clear_stamps(s);
  warm_params(r, p, s);
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int ctas = static_cast<int>(cluster.num_blocks());
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  // routing_shape::cluster_overlapped, written out: called, it changed the
  // SASS of the E <= 32 kernels, and this form is the one measured on the
  // H200. The CPU tests pin the header's form
  // (tests/cpu/test_routing_launch_shape.cpp).
  const int per_routing_cta = p.tokens_per_routing_cta;
  const bool overlapped = per_routing_cta <= warps &&
                          (!kDeepSeek || per_routing_cta * r.num_experts <= kWorkWords);  // uniform
  // Before the wait for the previous grid: nothing of it is read. The whole
  // way's first barrier phase opens here too: its CTAs store rows into CTA
  // 0's shared memory, which they may do only once CTA 0 has started.
  if (overlapped) {
    open_row_handoff(p, s, rank == 0);
  } else {
    cluster_arrive_relaxed();
  }
  pdl_begin();
  pdl_launch_dependents();
  phase_stamp(s, 1, threadIdx.x == 0);
  int16_t* staged = cluster.map_shared_rank(s.expert, 0);  // CTA 0's rows
  if (!overlapped) {
    cluster_wait();  // every CTA, CTA 0 too, has started
    const int per_cta = p.tokens_per_cta;  // a contiguous run a CTA
    const int begin = min(rank * per_cta, r.num_tokens);
    const int end = min(begin + per_cta, r.num_tokens);
    if constexpr (kDeepSeek) {
      route_deepseek_tokens<LogitT, kPerLane, kThreshold>(r, p, s, staged, begin, end);
    } else {
      float* group_keys = s.work.keys + warp * kPerLane * kWarpSize;
      route_tokens<LogitT, kPerLane, false, false, kThreshold>(r, p, group_keys, staged, lane, begin,
                                                               end, warp, warps);
    }
    phase_stamp(s, 3, threadIdx.x == 0);
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
    phase_stamp(s, 5, threadIdx.x == 0);
    if (rank == 0) permute_block<kHoldsSortedPair<kDeepSeek, kThreshold>>(p, s);
    phase_stamp(s, 7, threadIdx.x == 0);
    print_stamps(s, "cluster-whole", r, rank, ctas);
    return;
  }
  if (rank == 0) {
    // The token masks (CTA 0's work area, which no other CTA writes) are
    // zeroed while the routing CTAs route; the barrier's release and acquire
    // order the zeros before every thread's first use. Measured on an H200
    // (against zeroing them after the barrier): 0.975-0.99x where the masks
    // serve (Renormalize E=128 K=8 T=9-64 3.11-3.79 -> 3.04-3.70 us,
    // DeepSeekV3 E=256 K=8 T=64 5.67 -> 5.58), the cluster variant
    // 0.977-0.991 by geometric mean at T = 17..64.
    constexpr bool kPair = kHoldsSortedPair<kDeepSeek, kThreshold>;
    const BlockPermutePath path = block_permute_path<kPair>(p);  // uniform
    const bool cleared = takes_token_masks(path);
    if (cleared) {
      clear_token_masks(p, s);
      __syncthreads();  // the zeros before any thread's first bit
    }
    cluster_wait();  // the handoff's opening phase
    handoff_wait(&s.handoff);  // every routed row staged in s.expert
    phase_stamp(s, 5, threadIdx.x == 0);
    permute_block_on_path<kPair>(p, s, path, cleared);
    phase_stamp(s, 7, threadIdx.x == 0);
    print_stamps(s, "cluster", r, rank, ctas);
    return;
  }
  const int begin = min((rank - 1) * per_routing_cta, r.num_tokens);
  const int end = min(begin + per_routing_cta, r.num_tokens);
  const WideCall wide_call = plan_wide<kDeepSeek && kWide>(
      r, p, s.work.keys, 0, end - begin, routing_shape::kWideMaxTokensCluster, warp);
  if constexpr (kDeepSeek && !kDirectKeys) {
    stage_deepseek_keys<LogitT>(r, begin, end, s.work.keys);
    __syncthreads();
    phase_stamp(s, 2, threadIdx.x == 0);
  }
  const int token = begin + warp;
  const bool routes = token < end;  // uniform per warp
  TokenExperts chosen{};
  const bool wide =
      choose_wide_if_on<kDeepSeek && kWide>(r, s.work.keys, wide_call, lane, chosen,
                                            wide_steps(s));
  if (routes) {
    float* keys = kDeepSeek && !kDirectKeys ? s.work.keys + (token - begin) * r.num_experts
                                            : s.work.keys + warp * kPerLane * kWarpSize;
    if (!wide)
      chosen = choose_decode<LogitT, kPerLane, kDeepSeek, kThreshold, kDirectKeys>(r, token, lane,
                                                                                   keys);
  }
  phase_stamp(s, 3, threadIdx.x == 0);
  phase_stamp(s, 4, threadIdx.x == (end - begin - 1) * kWarpSize);
  cluster_wait();  // CTA 0's mbarrier is set up
  // The rows to CTA 0 by asynchronous stores, no fence; the ids go to
  // global memory after them, with the weights.
  if (routes) hand_off_rows(r.top_k, token, lane, local_expert(chosen.expert, p), s);
  if (routes) {
    const float weight = weigh_experts<LogitT, kDeepSeek>(r, chosen, token, lane < r.top_k);
    if (lane < r.top_k) {
      r.topk_ids[token * r.top_k + lane] = chosen.expert;
      r.topk_weights[token * r.top_k + lane] = weight;
    }
  }
  phase_stamp(s, 6, threadIdx.x == 0);
  print_stamps(s, "cluster", r, rank, ctas);
}

}  // namespace unimoe::fused_detail
