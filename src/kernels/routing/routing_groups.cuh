// DeepSeek's group stage: each group scored by the sum of its two best keys,
// the topk_group best kept, returned as a bit mask. Part of routing_device.cuh.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/group_index.h"
#include "kernels/routing/routing_keys.cuh"

namespace unimoe::routing_detail {

// The group of expert e: e / experts_per_group without an integer division
// (core/group_index.h, exact for every e and group size routing allows).
__device__ __forceinline__ int group_of(const RoutingKernelParams& p, int e) {
  return group_index(e, p.inv_experts_per_group);
}

// The group stage's verdict from each lane's top-2 pair of its share of its
// group (lanes past the groups hold -inf).
__device__ inline uint32_t rank_groups(const RoutingKernelParams& p, int lane, float first,
                                       float second) {
  const int group = lane >> p.lanes_per_group_log2, sub = lane & (p.lanes_per_group - 1);
  // Merge the top-2 pairs of a group's lanes (aligned, a power of two wide).
  for (int d = p.lanes_per_group / 2; d > 0; d /= 2) {
    const float other_first = __shfl_xor_sync(kFullMask, first, d);
    const float other_second = __shfl_xor_sync(kFullMask, second, d);
    second = fmaxf(fminf(first, other_first), fmaxf(second, other_second));
    first = fmaxf(first, other_first);
  }
  // The first lane of each group holds its score and ranks the group: the
  // groups with a larger score, or an equal one and a lower index, come
  // first; the first topk_group are kept. One pass of independent shuffles
  // rather than topk_group dependent rounds of warp_argmax (measured on an
  // H200: the group stage took about 1270 cycles of a one-token DeepSeek
  // call).
  const bool leader = group < p.n_group && sub == 0;
  const uint32_t group_key = order_key(nan_to_neg_inf(first + second));  // +inf + -inf
  int rank = 0;
  for (int g = 0; g < p.n_group; ++g) {
    const uint32_t other = __shfl_sync(kFullMask, group_key, g << p.lanes_per_group_log2);
    rank += other > group_key || (other == group_key && g < group);
  }
  const unsigned kept_leaders = __ballot_sync(kFullMask, leader && rank < p.topk_group);
  // Lane g < n_group reads group g's verdict from its first lane's bit.
  return __ballot_sync(kFullMask,
                       lane < p.n_group && ((kept_leaders >> (lane << p.lanes_per_group_log2)) & 1u));
}

// Keeps the topk_group groups with the largest sum of their two best keys
// (ties to the lower group) and returns them as a bit mask. The keys are read
// from `keys`, the token's E keys in shared memory, so that each group is
// read by its own lanes_per_group lanes (consecutive experts), and only a
// short butterfly within those lanes remains, rather than a full-warp
// reduction per group. Every lane calls it, after the keys are visible to it.
__device__ inline uint32_t kept_groups(const RoutingKernelParams& p, int lane, const float* keys) {
  const int per_group = p.experts_per_group;
  const int group = lane >> p.lanes_per_group_log2, sub = lane & (p.lanes_per_group - 1);
  float first = -INFINITY, second = -INFINITY;
  if (group < p.n_group) {
    const float* in_group = keys + group * per_group;
#pragma unroll 4
    for (int i = sub; i < per_group; i += p.lanes_per_group) {
      const float v = in_group[i];
      if (v > first) {
        second = first;
        first = v;
      } else if (v > second) {
        second = v;
      }
    }
  }
  return rank_groups(p, lane, first, second);
}

// kept_groups where each group is a run of whole lanes (runs of slots and
// experts_per_group = lanes_per_group * kPerLane, as E = 256, n_group = 8 at
// 8 slots): a lane's own keys are its share of its group, so no shared memory
// is read (measured on an H200: the split kernel's stores and reads of the
// keys there were 80% excess wavefronts at DeepSeekV3 E=256 T=16384).
template <int kPerLane>
__device__ inline uint32_t kept_groups_of_runs(const RoutingKernelParams& p, int lane,
                                               const float (&c)[kPerLane]) {
  float first = -INFINITY, second = -INFINITY;
  if ((lane >> p.lanes_per_group_log2) < p.n_group) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if (c[j] > first) {
        second = first;
        first = c[j];
      } else if (c[j] > second) {
        second = c[j];
      }
    }
  }
  return rank_groups(p, lane, first, second);
}

}  // namespace unimoe::routing_detail
