// Phase 1 of the fused and cluster routing kernels: a token's experts chosen
// by a warp (choose_decode) or by the wide choice, DeepSeek's keys staged by
// the block, and the decode calls' weights beside the permutation
// (route_then_permute). Part of fused_routing_kernels.cuh.
#pragma once

#include <cstdint>

#include "kernels/common/common.cuh"
#include "kernels/permute/block_permute.cuh"
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

}  // namespace unimoe::fused_detail
