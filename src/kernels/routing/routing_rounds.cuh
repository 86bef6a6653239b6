// The K rounds that choose a token's experts, one warp argmax a round: by a
// tree over each lane's slots, by sorted runs (take_heads), and by the kept
// DeepSeek groups' candidates in halves. Part of routing_device.cuh.
#pragma once

#include <cstdint>

#include "kernels/routing/routing_keys.cuh"

namespace unimoe::routing_detail {

// The K rounds of choose_experts, two ways; both leave lane k < K with the
// k-th best (expert, key), ties to the lower expert.
struct Chosen {
  int expert;
  uint32_t key;
};

// Each round: every lane's best slot by a tree of adjacent pairs (depth log2
// of the slots; strict compares and left-lower pairs, so the lower slot, the
// lower expert in either layout, keeps a tie), one warp argmax (the lowest
// expert among the lanes' equal bests), and the winner's slot cleared. About
// 45 instructions a round at 8 slots (counted from the SASS, not profiled).
template <int kPerLane, bool kRuns>
__device__ __forceinline__ Chosen rounds_by_tree(uint32_t (&key)[kPerLane], int top_k,
                                                 Slots<kPerLane, kRuns> slots) {
  const int lane = slots.lane;
  Chosen c{0, kNoKey};
  for (int k = 0; k < top_k; ++k) {
    uint32_t best[kPerLane];
    int best_j[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      best[j] = key[j];
      best_j[j] = j;
    }
#pragma unroll
    for (int w = 1; w < kPerLane; w *= 2) {
#pragma unroll
      for (int j = 0; j < kPerLane; j += 2 * w) {
        if (best[j + w] > best[j]) {
          best[j] = best[j + w];
          best_j[j] = best_j[j + w];
        }
      }
    }
    uint32_t top;
    const int winner = warp_argmax(best[0], slots.expert(best_j[0]), top);
    if (lane == k) c = Chosen{winner, top};
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (slots.expert(j) == winner) key[j] = kNoKey;
  }
  return c;
}

// Sorts kN packed values a lane, largest first (a bitonic network).
template <int kN>
__device__ __forceinline__ void sort_descending(uint64_t (&run)[kN]) {
#pragma unroll
  for (int size = 2; size <= kN; size *= 2) {
#pragma unroll
    for (int stride = size / 2; stride > 0; stride /= 2) {
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        const int l = i ^ stride;
        if (l > i) {
          const bool descending = (i & size) == 0;  // the last merge sorts all of it so
          const uint64_t hi = run[i] > run[l] ? run[i] : run[l];
          const uint64_t lo = run[i] > run[l] ? run[l] : run[i];
          run[i] = descending ? hi : lo;
          run[l] = descending ? lo : hi;
        }
      }
    }
  }
}

// K rounds over sorted runs (sort_descending: key above, a tie-break below
// that puts the lower expert first): each round one max-reduce over the
// lanes' head keys, the lowest lane that holds it wins (the runs must so
// lie that a lower lane holds lower experts), and the winner drops its
// head. expert_of(winner, low word of its head) names the expert.
template <int kN, class ExpertOf>
__device__ __forceinline__ Chosen take_heads(uint64_t (&run)[kN], int top_k, int lane,
                                             ExpertOf expert_of) {
  Chosen c{0, kNoKey};
  for (int k = 0; k < top_k; ++k) {
    const uint32_t head = static_cast<uint32_t>(run[0] >> 32);
    const uint32_t top = __reduce_max_sync(kFullMask, head);
    const int winner = __ffs(__ballot_sync(kFullMask, head == top)) - 1;
    const uint32_t winner_low = __shfl_sync(kFullMask, static_cast<uint32_t>(run[0]), winner);
    if (lane == k) c = Chosen{expert_of(winner, winner_low), top};
    if (lane == winner) {
#pragma unroll
      for (int j = 0; j + 1 < kN; ++j) run[j] = run[j + 1];
      run[kN - 1] = 0;  // key 0: never wins (every real key is above it)
    }
  }
  return c;
}

// Each lane sorts its slots once (sort_descending on (key, slot), the lower
// slot first among equal keys); then take_heads. Counted from the SASS (not
// profiled): about 150 instructions to sort 8 slots, then about 30 a round
// against the tree's 45, so fewer in all from K = 4 at 8 slots. Measured on
// an H200 only together with the runs layout (the split kernel against
// strided slots and the tree): Renormalize E=128 K=8 T=16384 23.75 -> 23.08
// us. Profiled (DeepSeekV3 E=256 K=8 T=16384): the sort 240 instructions a
// token, the rounds 32 each, half of them the winner's shift.
template <int kPerLane>
__device__ __forceinline__ Chosen rounds_by_sorted_runs(const uint32_t (&key)[kPerLane], int top_k,
                                                        Slots<kPerLane, true> slots) {
  uint64_t run[kPerLane];  // key above, (kPerLane - 1 - slot) below: unique, best first when larger
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    run[j] = (static_cast<uint64_t>(key[j]) << 32) | static_cast<uint32_t>(kPerLane - 1 - j);
  sort_descending(run);
  return take_heads(run, top_k, slots.lane, [](int winner, uint32_t low) {
    return winner * kPerLane + (kPerLane - 1) - static_cast<int>(low);
  });
}

// A (key, expert) pair in one 64-bit value: the key above, the expert's
// complement below, so that the larger pair has the larger key or, on equal
// keys, the lower expert; unique per expert. expert_of_pair gives it back.
__device__ __forceinline__ uint64_t key_expert_pair(uint32_t key, int expert) {
  return (static_cast<uint64_t>(key) << 32) | ~static_cast<uint32_t>(expert);
}
__device__ __forceinline__ int expert_of_pair(uint64_t pair) {
  return static_cast<int>(~static_cast<uint32_t>(pair));
}

// rounds_by_sorted_runs where the kept groups' lanes are at most half the
// warp (compacts_kept_lanes: DeepSeekV3's 4 of 8 groups at E = 256 leave 16
// lanes of 8 candidates): the kept lanes' candidates are spread two lanes
// to one, half a run each, through `area` (this warp's kPerLane * 32 words
// of shared memory, 8-byte aligned), so each lane sorts and shifts half as
// many. Lane 2r + h takes half h of the r-th kept lane: lanes still hold
// experts in increasing order, as take_heads needs. `kept`: the group mask
// of the group stage; every lane calls it.
template <int kPerLane>
__device__ __forceinline__ Chosen rounds_by_kept_halves(const RoutingKernelParams& p,
                                                        const uint32_t (&key)[kPerLane],
                                                        uint32_t kept, int lane, uint64_t* area) {
  constexpr int kHalf = kPerLane / 2;
  constexpr int kRows = kWarpSize / 2;  // kept lanes at most
  static_assert(kPerLane % 2 == 0, "two halves a run");
  const bool in_kept = ((kept >> (lane >> p.lanes_per_group_log2)) & 1u) != 0u;
  const unsigned kept_lanes = __ballot_sync(kFullMask, in_kept);
  if (in_kept) {
    const int rank = __popc(kept_lanes & ((1u << lane) - 1u));
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      area[j * kRows + rank] = key_expert_pair(key[j], lane * kPerLane + j);
  }
  __syncwarp();
  const int row = lane >> 1, half = lane & 1;
  const bool filled = row < __popc(kept_lanes);
  uint64_t run[kHalf];
#pragma unroll
  for (int i = 0; i < kHalf; ++i) run[i] = filled ? area[(half * kHalf + i) * kRows + row] : 0;
  __syncwarp();  // the area is read before anyone writes it again
  sort_descending(run);
  return take_heads(run, p.top_k, lane,
                    [](int, uint32_t low) { return expert_of_pair(low); });
}

}  // namespace unimoe::routing_detail
