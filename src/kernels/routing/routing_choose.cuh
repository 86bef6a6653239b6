// One token routed by one warp: choose_experts (logits, keys, group stage,
// the K rounds of the kernel's selection algorithm), weigh_experts, and
// route_token, both together. Part of routing_device.cuh.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/routing_launch_shape.h"
#include "core/routing_limits.h"
#include "kernels/routing/routing_groups.cuh"
#include "kernels/routing/routing_keys.cuh"
#include "kernels/routing/routing_rounds.cuh"
#include "kernels/routing/routing_slots.cuh"
#include "kernels/routing/routing_threshold.cuh"
#include "kernels/routing/routing_weights.cuh"

namespace unimoe::routing_detail {

// Whether rounds_by_kept_halves serves a call (host side: the plan takes
// the kept halves by the same rule, routing_limits::compacts_kept_lanes).
inline bool compacts_kept_lanes(const RoutingKernelParams& p, int per_lane) {
  return routing_limits::compacts_kept_lanes(p.n_group, p.topk_group, p.experts_per_group,
                                             per_lane);
}

// Where the split routing kernel sorts the runs (rounds_by_sorted_runs or
// rounds_by_kept_halves) rather than taking the tree:
// routing_shape::split_sorts_runs. A kernel holds one of the two ways only:
// a one-token call fetches its code from a cold instruction cache, and the
// fused kernels, which serve those calls, keep the tree.
using routing_shape::kSortMaxSlots;

// The experts of `token`, chosen by the whole warp (every lane calls it):
// route_token's first part, no weights. Lanes >= K get a value that means
// nothing. DeepSeek policies only:
//   - kStagedKeys false: `keys` is this warp's kPerLane * 32 floats of
//     shared memory, where the group stage (n_group > 1) puts the keys that
//     the warp computes;
//   - kStagedKeys true: `keys` holds the token's E keys already, computed by
//     the block (deepseek_key), visible to the warp.
// kRuns: the slots' layout (Slots). kSortedRuns (runs only): the K rounds
// by rounds_by_sorted_runs (kKeptHalves, DeepSeek's split kernel where
// compacts_kept_lanes holds: by rounds_by_kept_halves, `keys` its area),
// else by rounds_by_tree; kThreshold (the decode kernels, with `keys` a
// warp's own shared memory as threshold_area needs it): by
// rounds_by_threshold (at kRankedSlots strided slots,
// rounds_by_ranked_threshold) where it serves, else the tree. kWideLoads: as
// load_slots'.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kStagedKeys = false,
          bool kRuns = false, bool kSortedRuns = false, bool kWideLoads = false,
          bool kKeptHalves = false, bool kThreshold = false>
__device__ __forceinline__ TokenExperts choose_experts(const RoutingKernelParams& p, int token,
                                                       int lane, float* keys) {
  static_assert(kRuns || !kSortedRuns, "sorted rounds need runs");
  static_assert(!kKeptHalves || (kDeepSeek && kSortedRuns && !kStagedKeys),
                "kept halves: the split kernel's sorted DeepSeek rounds");
  const int num_experts = p.num_experts;
  const Slots<kPerLane, kRuns> slots{lane};
  const LogitT* row = static_cast<const LogitT*>(p.logits) + static_cast<size_t>(token) * num_experts;

  // The slots' logits, NaN as -inf; slots past E hold -inf and get kNoKey
  // below. (With staged keys DeepSeek never reads them: the loads go.)
  float x[kPerLane];
  if constexpr (!(kDeepSeek && kStagedKeys)) {
    load_slots<kWideLoads>(row, num_experts, slots, -INFINITY, x);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) x[j] = nan_to_neg_inf(x[j]);
  }

  RowSoftmax softmax{0.0f, 0.0, 0};
  if (!kDeepSeek &&
      (p.policy == RoutingPolicy::Default || p.policy == RoutingPolicy::RenormalizeNaive))
    softmax = row_softmax(x, num_experts, slots);

  uint32_t key[kPerLane];
  uint32_t kept = 1u;  // DeepSeek's kept groups, a bit each
  if constexpr (kDeepSeek) {
    float c[kPerLane];
    if constexpr (kStagedKeys) {
      load_slots<true>(keys, num_experts, slots, 0.0f, c);  // past E: never a candidate
    } else {
      float bias[kPerLane];
      if (p.bias != nullptr) {
        load_slots<kWideLoads>(p.bias, num_experts, slots, 0.0f, bias);
      } else {
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) bias[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) c[j] = deepseek_key(x[j], bias[j]);  // past E: never a candidate
    }
    bool runs_hold_groups = false;  // each group a run of whole lanes (kept_groups_of_runs)
    if (p.n_group > 1) {
      if constexpr (kRuns) runs_hold_groups = p.experts_per_group == p.lanes_per_group * kPerLane;
      if (runs_hold_groups) {
        kept = kept_groups_of_runs(p, lane, c);
      } else {
        if constexpr (!kStagedKeys) {
#pragma unroll
          for (int j = 0; j < kPerLane; ++j) keys[slots.expert(j)] = c[j];
          __syncwarp();
        }
        kept = kept_groups(p, lane, keys);
      }
    }
    // Candidates: before E and, with groups, in a kept group. Formed
    // without a branch a slot (c is never NaN, so order_key is defined).
    bool candidate[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) candidate[j] = slots.expert(j) < num_experts;
    if (runs_hold_groups) {
      const bool in_kept = ((kept >> (lane >> p.lanes_per_group_log2)) & 1u) != 0u;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) candidate[j] = candidate[j] & in_kept;
    } else if (p.n_group > 1) {
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        candidate[j] = candidate[j] & (((kept >> group_of(p, slots.expert(j))) & 1u) != 0u);
    }
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) key[j] = candidate[j] ? order_key(c[j]) : kNoKey;
  } else {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      key[j] = slots.expert(j) < num_experts ? order_key(x[j]) : kNoKey;
  }

  // K rounds; lane k keeps the k-th choice. Where the key is the logit
  // itself, the winning key gives the logit back; DeepSeek's chosen lanes
  // load theirs afterwards.
  Chosen chosen;
  if constexpr (kKeptHalves) {
    chosen = rounds_by_kept_halves(p, key, kept, lane, reinterpret_cast<uint64_t*>(keys));
  } else if constexpr (kSortedRuns) {
    chosen = rounds_by_sorted_runs(key, p.top_k, slots);
  } else if constexpr (kThreshold && kPerLane >= kThresholdMinSlots) {
    if (!(threshold_serves<kPerLane, kRuns>(p) &&
          rounds_by_threshold(key, p.top_k, slots, threshold_area(keys), chosen)))
      chosen = rounds_by_tree(key, p.top_k, slots);
  } else if constexpr (kThreshold && kPerLane == kRankedSlots && !kRuns) {
    if (!(threshold_serves<kPerLane, kRuns>(p) &&
          rounds_by_ranked_threshold(key, p.top_k, slots, threshold_area(keys), chosen)))
      chosen = rounds_by_tree(key, p.top_k, slots);
  } else {
    chosen = rounds_by_tree(key, p.top_k, slots);
  }
  // Lanes >= K: 0, as the weight code expects. DeepSeek's logit is loaded
  // by weigh_experts.
  const float chosen_x = !kDeepSeek && lane < p.top_k ? key_value(chosen.key) : 0.0f;
  return TokenExperts{chosen.expert, chosen_x, softmax};
}

// route_token's second part: the weight of an active lane's expert t of
// `token` (one token: lanes k < K active). Every lane of the warp calls it;
// kSegments as chosen_weight's.
template <typename LogitT, bool kDeepSeek, bool kSegments = false>
__device__ __forceinline__ float weigh_experts(const RoutingKernelParams& p, const TokenExperts& t,
                                               int token, bool active) {
  float x = t.x;
  if (kDeepSeek && active) {
    const LogitT* row = static_cast<const LogitT*>(p.logits) + static_cast<size_t>(token) * p.num_experts;
    x = nan_to_neg_inf(load_logit(row, t.expert));
  }
  return static_cast<float>(chosen_weight<kDeepSeek, kSegments>(p, t.softmax, x, active));
}

// Routes `token` with the whole warp (every lane calls it); `keys` as
// choose_experts'.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kStagedKeys = false,
          bool kRuns = false, bool kSortedRuns = false, bool kWideLoads = false,
          bool kKeptHalves = false, bool kThreshold = false>
__device__ __forceinline__ TokenChoice route_token(const RoutingKernelParams& p, int token,
                                                   int lane, float* keys) {
  const TokenExperts t = choose_experts<LogitT, kPerLane, kDeepSeek, kStagedKeys, kRuns, kSortedRuns,
                                        kWideLoads, kKeptHalves, kThreshold>(p, token, lane, keys);
  return TokenChoice{t.expert, weigh_experts<LogitT, kDeepSeek>(p, t, token, lane < p.top_k)};
}

}  // namespace unimoe::routing_detail
