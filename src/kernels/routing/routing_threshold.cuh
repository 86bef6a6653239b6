// The K best keys of a warp in a fixed number of steps (the decode
// kernels): a threshold from the lanes' bests, then a ranked list of the
// keys that reach it (rounds_by_threshold, rounds_by_ranked_threshold).
// Part of routing_device.cuh.
#pragma once

#include <cstdint>

#include "core/routing_launch_shape.h"
#include "kernels/common/common.cuh"
#include "kernels/routing/routing_keys.cuh"
#include "kernels/routing/routing_rounds.cuh"

namespace unimoe::routing_detail {

// Each candidate's place in the list (bits: slot j of this lane is one),
// slots in turn, lanes in order within a slot, and the list's length.
template <int kPerLane>
__device__ __forceinline__ void list_places(uint32_t bits, int lane, int& place, int& total) {
  const unsigned below = (1u << lane) - 1u;
  place = 0;
  total = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const unsigned b = __ballot_sync(kFullMask, (bits >> j) & 1u);
    place += __popc(b & below);
    total += __popc(b);
  }
}

// This lane's best key, also stored at word `lane` of `area` for the
// warp's threshold (every lane is done with what `area` held; every lane
// calls it).
template <int kPerLane>
__device__ __forceinline__ uint32_t share_lane_best(const uint32_t (&key)[kPerLane], int lane,
                                                    uint64_t* area) {
  uint32_t best = key[0];
#pragma unroll
  for (int j = 1; j < kPerLane; ++j) best = max(best, key[j]);
  __syncwarp();  // every lane is done with what `area` held
  reinterpret_cast<uint32_t*>(area)[lane] = best;
  __syncwarp();
  return best;
}

// The K best of the warp's keys in a fixed number of steps rather than K
// dependent rounds, for the decode kernels (measured on an H200, each token
// chosen twice in one launch, the second time from a warm instruction cache:
// choosing took about 2,100 cycles at Renormalize E=128 K=8, 2,500 at E=256,
// both with the logits' load, and 3,500 at DeepSeekV3 E=256; this way cut the
// first by about 280 only; its gain grows with the slots a lane and with K:
// routing_shape::threshold_serves):
//   1. t: the K-th largest of the lanes' best keys (each lane counts the
//      lanes whose best is >= its own, t the largest best with a count of
//      at least K). K lanes hold a key >= t, so the K best keys are >= t;
//   2. the candidates, the keys >= t (about K at random logits), go to
//      `area` as (key, expert) pairs, each at its place from one ballot a
//      slot (or a warp scan, past 8 slots);
//   3. lane i ranks the i-th candidate: the count of larger pairs (pairs
//      are unique, larger meaning a larger key or, at equal keys, the lower
//      expert: the rounds' order), and the candidate of rank k < K goes to
//      lane k through `area`.
// Returns false, `key` as it came (`area` holds the lanes' bests), where
// more than kWarpSize keys reach t (ties, or t = kNoKey where fewer than K
// lanes hold a candidate): the caller takes the rounds. `area`: this warp's
// 32 pairs of shared memory, 16-byte aligned, free to overwrite once every
// lane holds its keys; every lane calls it.
template <int kPerLane, bool kRuns>
__device__ __forceinline__ bool rounds_by_threshold(const uint32_t (&key)[kPerLane], int top_k,
                                                    Slots<kPerLane, kRuns> slots, uint64_t* area,
                                                    Chosen& chosen) {
  const int lane = slots.lane;
  const uint32_t best = share_lane_best(key, lane, area);
  const uint32_t* bests = reinterpret_cast<const uint32_t*>(area);
  int reach = 0;  // lanes whose best is >= this lane's
#pragma unroll
  for (int q = 0; q < kWarpSize / 4; ++q) {
    const uint4 v = reinterpret_cast<const uint4*>(bests)[q];
    reach += (v.x >= best) + (v.y >= best) + (v.z >= best) + (v.w >= best);
  }
  const uint32_t t = __reduce_max_sync(kFullMask, reach >= top_k ? best : kNoKey);
  uint32_t bits = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) bits |= (key[j] >= t && key[j] != kNoKey ? 1u : 0u) << j;
  int place, total;  // this lane's first place in the list, and the list's length
  if constexpr (kPerLane <= 8) {
    list_places<kPerLane>(bits, lane, place, total);
  } else {
    const int n = __popc(bits);
    int inclusive = warp_inclusive_sum(n, lane);
    place = inclusive - n;
    total = __shfl_sync(kFullMask, inclusive, kWarpSize - 1);
  }
  if (total > kWarpSize) return false;  // uniform
  __syncwarp();  // every lane has read the bests
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    if ((bits >> j) & 1u) area[place++] = key_expert_pair(key[j], slots.expert(j));
  }
  if (lane == 0 && (total & 1)) area[total] = 0;  // below every pair: the list in whole 16 bytes
  __syncwarp();
  const uint64_t mine = lane < total ? area[lane] : 0;
  int rank = 0;
#pragma unroll 4
  for (int i = 0; i < total; i += 2) {
    const ulonglong2 two = reinterpret_cast<const ulonglong2*>(area)[i / 2];
    rank += (two.x > mine) + (two.y > mine);
  }
  __syncwarp();  // every lane has read the list
  if (lane < total && rank < top_k) area[rank] = mine;
  __syncwarp();
  const uint64_t pair = lane < top_k ? area[lane] : 0;
  chosen = lane < top_k ? Chosen{expert_of_pair(pair), static_cast<uint32_t>(pair >> 32)}
                        : Chosen{0, kNoKey};
  return true;
}

// order_key(v) for a NaN-free v: v + 0 folds -0 into +0 (round to nearest),
// then the sign selects the xor mask.
__device__ __forceinline__ uint32_t order_key_fast(float v) {
  const uint32_t bits = __float_as_uint(__fadd_rn(v, 0.0f));
  return bits ^ (static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u);
}

// The K best of total <= 32 candidates (bits, at their places from
// list_places) into lanes 0..K-1, best first: the list by predicated
// stores (a lane stores only its listed slots, each at its own place, so no
// two lanes write one address and racecheck stays a working gate), padded
// to 32 pairs, and each candidate's rank (the count of larger pairs: a
// larger key, or an equal key and a lower expert) from a fixed run of
// 16-byte loads with independent counts. area: 32 pairs of the warp's
// shared memory, 16-byte aligned, free to overwrite once every lane holds
// its keys. Every lane calls it.
template <int kPerLane, bool kRuns>
__device__ __forceinline__ Chosen rank_candidates(const uint32_t (&key)[kPerLane], uint32_t bits,
                                                  int place, int total, int top_k,
                                                  Slots<kPerLane, kRuns> slots, uint64_t* area) {
  const int lane = slots.lane;
  __syncwarp();  // every lane is done with what `area` held
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const bool in = (bits >> j) & 1u;
    if (in) area[place] = key_expert_pair(key[j], slots.expert(j));
    place += in;
  }
  if (lane >= total) area[lane] = 0;  // below every pair: 32 in all
  __syncwarp();
  const uint64_t mine = area[lane];
  int above[4] = {0, 0, 0, 0};
  const ulonglong2* list = reinterpret_cast<const ulonglong2*>(area);
#pragma unroll
  for (int q = 0; q < kWarpSize / 4; ++q) {
    const ulonglong2 two = list[q];
    above[q % 2 * 2] += two.x > mine;
    above[q % 2 * 2 + 1] += two.y > mine;
  }
  if (total > kWarpSize / 2) {  // uniform
#pragma unroll
    for (int q = kWarpSize / 4; q < kWarpSize / 2; ++q) {
      const ulonglong2 two = list[q];
      above[q % 2 * 2] += two.x > mine;
      above[q % 2 * 2 + 1] += two.y > mine;
    }
  }
  const int order = (above[0] + above[1]) + (above[2] + above[3]);
  __syncwarp();  // every lane has read the list
  if (lane < total && order < top_k) area[order] = mine;
  __syncwarp();
  const uint64_t pair = area[lane];
  return lane < top_k ? Chosen{expert_of_pair(pair), static_cast<uint32_t>(pair >> 32)}
                      : Chosen{0, kNoKey};
}

// rounds_by_threshold's threshold, its list ranked by rank_candidates: the
// form of the policies without groups at routing_shape::kRankedSlots strided
// slots a lane (E = 65..128), where rounds_by_threshold's own list and ranks
// were no faster than the rounds (its fixed steps cost about what they saved
// at 4 slots). The lanes' bests are counted with four independent sums.
// Returns false, as rounds_by_threshold does, where fewer than K lanes hold a
// key or more than kWarpSize keys reach the threshold. area: rank_candidates'
// 32 pairs.
template <int kPerLane, bool kRuns>
__device__ __forceinline__ bool rounds_by_ranked_threshold(const uint32_t (&key)[kPerLane],
                                                           int top_k, Slots<kPerLane, kRuns> slots,
                                                           uint64_t* area, Chosen& chosen) {
  static_assert(kPerLane <= 8, "list_places: one ballot a slot");
  const int lane = slots.lane;
  const uint32_t best = share_lane_best(key, lane, area);
  const uint32_t* bests = reinterpret_cast<const uint32_t*>(area);
  int reach[4] = {0, 0, 0, 0};  // lanes whose best is >= this lane's
#pragma unroll
  for (int q = 0; q < kWarpSize / 4; ++q) {
    const uint4 v = reinterpret_cast<const uint4*>(bests)[q];
    reach[0] += v.x >= best;
    reach[1] += v.y >= best;
    reach[2] += v.z >= best;
    reach[3] += v.w >= best;
  }
  const int count = (reach[0] + reach[1]) + (reach[2] + reach[3]);
  const uint32_t t = __reduce_max_sync(kFullMask, count >= top_k ? best : kNoKey);
  if (t == kNoKey) return false;  // uniform: fewer than K lanes hold a key
  uint32_t bits = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) bits |= (key[j] >= t ? 1u : 0u) << j;
  int place, total;
  list_places<kPerLane>(bits, lane, place, total);
  if (total > kWarpSize) return false;  // uniform
  chosen = rank_candidates(key, bits, place, total, top_k, slots, area);
  return true;
}

using routing_shape::kRankedSlots;
using routing_shape::kThresholdMinSlots;

// routing_shape::threshold_serves for a kernel's slots and layout.
template <int kPerLane, bool kRuns>
__device__ __forceinline__ bool threshold_serves(const RoutingKernelParams& p) {
  return routing_shape::threshold_serves(p.top_k, kPerLane, kRuns, p.topk_group,
                                         p.experts_per_group);
}

// rounds_by_threshold's and rank_candidates' area, 32 pairs in `keys`: a
// warp's kPerLane * 32 words of group keys, or a token's E > 128 staged
// DeepSeek keys, 16-byte aligned up (the kernels take it at
// kThresholdMinSlots slots a lane, or kRankedSlots: 128 words). Aligned by
// pointer arithmetic on `keys`, not through an integer: an integer cast loses
// the shared state space, and the list's loads and stores become generic
// ones.
__device__ __forceinline__ uint64_t* threshold_area(float* keys) {
  const int words_past = static_cast<int>((reinterpret_cast<uintptr_t>(keys) >> 2) & 3u);
  return reinterpret_cast<uint64_t*>(keys + ((4 - words_past) & 3));
}

}  // namespace unimoe::routing_detail
