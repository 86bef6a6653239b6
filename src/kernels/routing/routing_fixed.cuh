// DeepSeek's decode choice with its shape as template constants: E = 256
// (8 slots a lane, in runs), kGroups groups of whole lanes, kKept kept, K
// up to 2 * kKept (routing_shape::fixed_choice_serves: DeepSeek-V3/R1's 8
// groups, 4 kept, K = 8). The same ids in the same order as choose_decode
// (routing_device.cuh's group stage, then rounds_by_threshold or the
// rounds), in fewer instructions and dependent steps:
//   - each lane's top-2 by a tree of pairs, not a chain of 8 compares;
//   - every lane ranks its own group from the group leaders' scores (no
//     runtime loop, no ballot for the verdict);
//   - the threshold t is the least second-best key of the kept groups (each
//     holds two keys >= its second best, 2 * kKept >= K in all): one warp
//     min-reduce of what the group stage has already, instead of the K-th
//     largest lane best;
//   - keys by an add of +0 and one xor (order_key's value, 3 instructions);
//   - the candidates' list written by predicated stores, padded to 32
//     pairs, and ranked in a fixed run of 16-byte loads with independent
//     counts (rank_candidates).
// More than 32 candidates (ties, an infinite key) take the rounds, as
// choose_decode does. The list and ranks are routing_device.cuh's
// rank_candidates.
#pragma once

#include "core/routing_launch_shape.h"
#include "kernels/routing/routing_device.cuh"

namespace unimoe::routing_detail {

// c: this lane's 8 keys (experts lane * 8 ..), NaN already -inf; top_k at
// most 2 * kKept (routing_shape::fixed_choice_serves). area: as
// rank_candidates'. Every lane calls it; lane k < K gets the k-th best.
template <int kGroups, int kKept>
__device__ __forceinline__ Chosen choose_deepseek_fixed(const float (&c)[8], int top_k, int lane,
                                                        uint64_t* area) {
  constexpr int kPerLane = 8;
  constexpr int kLanesPerGroup = kWarpSize / kGroups;
  static_assert(kWarpSize % kGroups == 0 && kLanesPerGroup >= 1, "a group is whole lanes");
  // The top-2 (with multiplicity) of this lane's keys, then of its group's.
  const auto merge = [](float& first, float& second, float other_first, float other_second) {
    second = fmaxf(fminf(first, other_first), fmaxf(second, other_second));
    first = fmaxf(first, other_first);
  };
  float first[4], second[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    first[i] = fmaxf(c[2 * i], c[2 * i + 1]);
    second[i] = fminf(c[2 * i], c[2 * i + 1]);
  }
  merge(first[0], second[0], first[1], second[1]);
  merge(first[2], second[2], first[3], second[3]);
  merge(first[0], second[0], first[2], second[2]);
#pragma unroll
  for (int d = kLanesPerGroup / 2; d > 0; d /= 2)
    merge(first[0], second[0], __shfl_xor_sync(kFullMask, first[0], d),
          __shfl_xor_sync(kFullMask, second[0], d));

  // This lane's group's rank: groups with a larger score, or an equal one
  // and a lower index, come first (rank_groups' order).
  const int group = lane / kLanesPerGroup;
  const uint32_t group_key = order_key_fast(nan_to_neg_inf(first[0] + second[0]));
  int rank = 0;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const uint32_t other = __shfl_sync(kFullMask, group_key, g * kLanesPerGroup);
    rank += (other > group_key) | ((other == group_key) & (g < group));
  }
  const bool kept = rank < kKept;
  const uint32_t t = __reduce_min_sync(kFullMask, kept ? order_key_fast(second[0]) : ~0u);

  uint32_t key[kPerLane];
  uint32_t bits = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    key[j] = order_key_fast(c[j]);
    bits |= (kept && key[j] >= t ? 1u : 0u) << j;
  }
  int place, total;
  list_places<kPerLane>(bits, lane, place, total);
  const Slots<kPerLane, true> slots{lane};
  if (total > kWarpSize) {  // uniform
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) key[j] = kept ? key[j] : kNoKey;
    return rounds_by_tree(key, top_k, slots);
  }
  return rank_candidates(key, bits, place, total, top_k, slots, area);
}

// choose_decode's DeepSeek choice where r.fixed_choice says (the launcher
// sets it where routing_shape::fixed_choice_serves): the lane's 8 keys from
// the token's staged row `keys` or, kDirectKeys, computed from its logits
// and the bias by 16-byte loads (as choose_experts computes them); the list
// then overwrites `keys` (with kDirectKeys the warp's own 256 words).
template <typename LogitT, bool kDirectKeys>
__device__ __forceinline__ TokenExperts choose_fixed_decode(const RoutingKernelParams& r,
                                                           int token, int lane, float* keys) {
  using routing_shape::kFixedGroups;
  using routing_shape::kFixedKept;
  constexpr int kPerLane = routing_shape::kFixedExperts / kWarpSize;
  static_assert(kPerLane == 8, "choose_deepseek_fixed holds 8 slots a lane");
  float c[kPerLane];
  if constexpr (kDirectKeys) {
    const Slots<kPerLane, true> slots{lane};
    const LogitT* row =
        static_cast<const LogitT*>(r.logits) + static_cast<size_t>(token) * r.num_experts;
    float x[kPerLane], bias[kPerLane];
    load_slots<true>(row, r.num_experts, slots, -INFINITY, x);
    if (r.bias != nullptr) {
      load_slots<true>(r.bias, r.num_experts, slots, 0.0f, bias);
    } else {
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) bias[j] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) c[j] = deepseek_key(nan_to_neg_inf(x[j]), bias[j]);
  } else {
    const float4 lo = reinterpret_cast<const float4*>(keys + lane * kPerLane)[0];
    const float4 hi = reinterpret_cast<const float4*>(keys + lane * kPerLane)[1];
    c[0] = lo.x, c[1] = lo.y, c[2] = lo.z, c[3] = lo.w;
    c[4] = hi.x, c[5] = hi.y, c[6] = hi.z, c[7] = hi.w;
  }
  const Chosen chosen =
      choose_deepseek_fixed<kFixedGroups, kFixedKept>(c, r.top_k, lane, threshold_area(keys));
  return TokenExperts{chosen.expert, 0.0f, RowSoftmax{0.0f, 0.0, 0}};
}

}  // namespace unimoe::routing_detail
