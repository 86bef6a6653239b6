// The fused and cluster routing kernels (the family: fused_routing.cu):
// phase 1, a token's experts chosen by a warp or, where it serves, by the
// wide choice (routing_wide.cuh), then phases 2-4 (block_permute.cuh) in
// the single block, or in CTA 0 of a cluster while the other CTAs route.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/permute/block_permute.cuh"
#include "kernels/common/cluster_handoff.cuh"
#include "kernels/common/common.cuh"
#include "kernels/routing/routing_fixed.cuh"

namespace unimoe::fused_detail {

// Whether a fused or cluster kernel holds permute_sorted_pair: all but the
// threshold kernels of the policies without groups (permute_block).
template <bool kDeepSeek, bool kThreshold>
inline constexpr bool kHoldsSortedPair = kDeepSeek || !kThreshold;

// The experts of `token`, as the fused, cluster and spread kernels choose
// them (every lane of the warp calls it): DeepSeek's keys staged by the
// block (kDirectKeys: computed by the warp from its lanes' logits and
// biases, 16-byte loads, as the split kernel does) and its slots in runs,
// the others' strided; the K best by rounds_by_threshold in the kernels
// built with it (kThreshold: the launcher takes them where
// routing_shape::threshold_serves), or in DeepSeek's threshold kernels of 8
// slots by the fixed choice where r.fixed_choice says (routing_fixed.cuh).
// `keys`: as choose_experts' (with kDirectKeys, the warp's kPerLane * 32
// floats).
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold, bool kDirectKeys = false>
__device__ __forceinline__ TokenExperts choose_decode(const RoutingKernelParams& r, int token,
                                                      int lane, float* keys) {
  if constexpr (kDeepSeek && kThreshold && kPerLane == routing_shape::kFixedExperts / kWarpSize) {
    if (r.fixed_choice != 0) return choose_fixed_decode<LogitT, kDirectKeys>(r, token, lane, keys);
  }
  return choose_experts<LogitT, kPerLane, kDeepSeek, kDeepSeek && !kDirectKeys, kDeepSeek, false,
                        kDirectKeys, false, kThreshold>(r, token, lane, keys);
}

// The wide choice (routing_wide.cuh) in a DeepSeek kernel's decode path:
// whether p.wide_parts seats the block's `tokens` tokens, at most
// max_tokens (their keys to be staged in `keys`, a row of E each; the first
// parts at warps first_lead ..), and this warp's plan; made before the keys
// are staged (uniform; off in the other kernels).
struct WideCall {
  bool on;
  WidePlan plan;
};

template <bool kDeepSeek>
__device__ __forceinline__ WideCall plan_wide(const RoutingKernelParams& r,
                                              const BlockPermuteParams& p, float* keys,
                                              int first_lead, int tokens, int max_tokens,
                                              int warp) {
  WideCall call{};
  if constexpr (kDeepSeek) {
    const int parts = p.wide_parts;
    call.on = routing_shape::wide_fits(tokens, parts, static_cast<int>(blockDim.x / kWarpSize),
                                       max_tokens);
    if (call.on)  // off the chain: the keys are not staged yet
      call.plan = WidePlan{
          wide_seat(warp, first_lead, tokens, parts), parts, p.wide_floor_rank,
          wide_area(keys, tokens, r.num_experts, parts)};
  }
  return call;
}

// The wide choice where `call` is on (every thread of the block calls it,
// after the keys are staged): then on lanes k < K of token t's first part
// its k-th expert in `chosen`, as choose_decode leaves it.
template <bool kDeepSeek>
__device__ __forceinline__ bool choose_wide_if_on(const RoutingKernelParams& r, const float* keys,
                                                  const WideCall& call, int lane,
                                                  TokenExperts& chosen, long long* steps) {
  if constexpr (kDeepSeek) {
    if (!call.on) return false;
    const Chosen c = choose_wide(r, keys, call.plan, lane, steps);
    chosen = TokenExperts{c.expert, 0.0f, RowSoftmax{0.0f, 0.0, 0}};
    return true;
  }
  return false;
}

// Phase 1: this warp (this thread its lane `lane`) routes tokens begin +
// first_warp, + warp_stride, ... below end and stages each row's local
// expert in `staged` (this block's s.expert, or CTA 0's in the cluster
// variant). `keys`: as route_token's; with kStagedKeys, row i of E holds
// token begin + i's keys.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kStagedKeys, bool kThreshold>
__device__ __forceinline__ void route_tokens(const RoutingKernelParams& r, const BlockPermuteParams& p,
                                             float* keys, int16_t* staged, int lane, int begin,
                                             int end, int first_warp, int warp_stride) {
  for (int token = begin + first_warp; token < end; token += warp_stride) {  // uniform per warp
    float* token_keys = kStagedKeys ? keys + (token - begin) * r.num_experts : keys;
    const TokenChoice choice =
        route_token<LogitT, kPerLane, kDeepSeek, kStagedKeys, kDeepSeek, false, false, false,
                    kThreshold>(r, token, lane, token_keys);
    if (lane < r.top_k) {
      const int row = token * r.top_k + lane;
      r.topk_ids[row] = choice.expert;
      r.topk_weights[row] = choice.weight;
      staged[row] = local_expert(choice.expert, p);
    }
    __syncwarp();  // the next token's group keys overwrite this one's
  }
}

// DeepSeek's selection keys of tokens [begin, end), E a row, computed by the
// whole block, an expert a thread: one exp each rather than E / 32 in a row
// on one lane, and a short stretch of code (the lane-unrolled form is
// several KB that a cold instruction cache fetches once per call). Each
// thread loads kKeyBatch logits (and biases) before it computes any key, so
// a thread with several keys waits for one load round trip, not one per key.
constexpr int kKeyBatch = 4;

template <typename LogitT>
__device__ void stage_deepseek_keys(const RoutingKernelParams& r, int begin, int end, float* keys) {
  const int num_experts = r.num_experts, threads = blockDim.x;
  const LogitT* logits =
      static_cast<const LogitT*>(r.logits) + static_cast<size_t>(begin) * num_experts;
  const int n = (end - begin) * num_experts;
  // x % E by exact_quotient: two integer divisions here stood between the
  // kernel's start and its first load (Nsight Compute: about 20 dependent
  // instructions each).
  const auto mod_experts = [&](int x) {
    return x - exact_quotient(x, r.inv_num_experts) * num_experts;
  };
  if (n <= threads) {  // one key a thread at most (decode): the short path
    const int i = threadIdx.x;
    if (i < n) {
      const float x = load_logit(logits, i);
      const float bias = r.bias != nullptr ? r.bias[mod_experts(i)] : 0.0f;
      keys[i] = deepseek_key(nan_to_neg_inf(x), bias);
    }
    return;
  }
  const int step = mod_experts(threads);  // e = i % E, kept without dividing
  int e = mod_experts(threadIdx.x);
#pragma unroll 1
  for (int base = threadIdx.x; base < n; base += kKeyBatch * threads) {
    float x[kKeyBatch], bias[kKeyBatch];
#pragma unroll
    for (int j = 0; j < kKeyBatch; ++j) {
      const int i = base + j * threads;
      x[j] = i < n ? load_logit(logits, i) : 0.0f;
      bias[j] = i < n && r.bias != nullptr ? r.bias[e] : 0.0f;
      e += step;
      if (e >= num_experts) e -= num_experts;
    }
#pragma unroll
    for (int j = 0; j < kKeyBatch; ++j) {
      const int i = base + j * threads;
      if (i < n) keys[i] = deepseek_key(nan_to_neg_inf(x[j]), bias[j]);
    }
  }
}

// Phase 1 for DeepSeek policies: this block routes tokens [begin, end), as
// many at a time as the work area holds keys for (at least 8), the block
// staging their keys first. Every thread calls it with the same range.
template <typename LogitT, int kPerLane, bool kThreshold>
__device__ void route_deepseek_tokens(const RoutingKernelParams& r, const BlockPermuteParams& p,
                                      BlockShared& s, int16_t* staged, int begin, int end) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int chunk = exact_quotient(kWorkWords, r.inv_num_experts);
#pragma unroll 1
  for (int first = begin; first < end; first += chunk) {
    const int last = min(first + chunk, end);
    stage_deepseek_keys<LogitT>(r, first, last, s.work.keys);
    __syncthreads();
    route_tokens<LogitT, kPerLane, true, true, kThreshold>(r, p, s.work.keys, staged, lane, first,
                                                           last, warp, warps);
    __syncthreads();  // the next chunk's keys overwrite these
  }
}

// Whether route_then_permute serves this call: at most 32 rows (the
// one-piece permutation), a warp for each token and at least one to spare,
// and for DeepSeek every token's keys staged at once.
__device__ __forceinline__ bool weights_beside_permute(const RoutingKernelParams& r,
                                                       const BlockPermuteParams& p, bool deepseek) {
  return p.rows <= kWarpSize && r.num_tokens < static_cast<int>(blockDim.x / kWarpSize) &&
         (!deepseek || r.num_tokens * r.num_experts <= kWorkWords);
}

// Decode calls (weights_beside_permute): warp t < T chooses token t's experts
// and stages them; after one barrier it weighs them while the other warps
// build the permutation, which needs only the experts. The weights (fp64 exp,
// sums and divisions: about 1200 of a one-token call's cycles, measured with
// clock64 stamps) then do not run before the permutation.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold, bool kWide>
__device__ void route_then_permute(const RoutingKernelParams& r, const BlockPermuteParams& p,
                                   BlockShared& s, int lane, int warp) {
  const WideCall wide_call = plan_wide<kDeepSeek && kWide>(
      r, p, s.work.keys, 0, r.num_tokens, routing_shape::kWideMaxTokensBlock, warp);
  if constexpr (kDeepSeek) {
    stage_deepseek_keys<LogitT>(r, 0, r.num_tokens, s.work.keys);
    __syncthreads();
    phase_stamp(s, 2, threadIdx.x == 0);
  }
  const int token = warp, top_k = r.top_k;
  const bool routes = token < r.num_tokens;  // uniform per warp
  TokenExperts chosen{};
  const bool wide =
      choose_wide_if_on<kDeepSeek && kWide>(r, s.work.keys, wide_call, lane, chosen,
                                            wide_steps(s));
  if (routes) {
    float* keys = kDeepSeek ? s.work.keys + token * r.num_experts
                            : s.work.keys + warp * kPerLane * kWarpSize;
    if (!wide)
      chosen = choose_decode<LogitT, kPerLane, kDeepSeek, kThreshold>(r, token, lane, keys);
    if (lane < top_k) {
      r.topk_ids[token * top_k + lane] = chosen.expert;
      s.expert[token * top_k + lane] = local_expert(chosen.expert, p);
    }
  }
  phase_stamp(s, 3, threadIdx.x == 0);
  phase_stamp(s, 4, threadIdx.x == (r.num_tokens - 1) * kWarpSize);
  __syncthreads();
  phase_stamp(s, 5, threadIdx.x == 0);
  if (routes) {
    const float weight = weigh_experts<LogitT, kDeepSeek>(r, chosen, token, lane < r.top_k);
    if (lane < top_k) r.topk_weights[token * top_k + lane] = weight;
    phase_stamp(s, 6, threadIdx.x == 0);
  } else {
    permute_piece(p, s, r.num_tokens * kWarpSize);
    phase_stamp(s, 7, threadIdx.x == r.num_tokens * kWarpSize);
  }
}

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
// Every thread arrives once at the cluster barrier and waits once.
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
  // Before the wait for the previous grid: nothing of it is read.
  if (overlapped) open_row_handoff(p, s, rank == 0);
  pdl_begin();
  pdl_launch_dependents();
  phase_stamp(s, 1, threadIdx.x == 0);
  int16_t* staged = cluster.map_shared_rank(s.expert, 0);  // CTA 0's rows
  if (!overlapped) {
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
