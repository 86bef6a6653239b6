// The per-token routing math on the device, shared by the routing kernel
// (routing.cu) and the fused routing + permute kernel (fused_routing.cu), so
// that both give the same ids and weights bit for bit. Formulas:
// docs/routing.md; contract: routing.cuh.
//
// One warp routes one token: each lane holds kPerLane experts in registers
// (Slots: strided or in runs), and K rounds of a warp argmax pick the
// experts, best first. Keys are floats mapped to order-preserving uint32, so
// one max-reduce finds the best key, and among the slots that hold it the
// lowest expert wins: ties go to the lower expert, as in the reference. Key 0
// lies below every float (-inf included) and marks experts already chosen,
// masked by the group stage, or past E.
// Weights are computed in double from the fp32 logits, as the reference does
// (only the all-expert softmax sum of Default and RenormalizeNaive adds fp32
// terms), so they agree with it within a few fp32 ulps.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/exact_quotient.h"
#include "core/group_index.h"
#include "core/routing_launch_shape.h"
#include "core/sigmoid_fp32.h"
#include "kernels/common/common.cuh"
#include "kernels/routing/routing.cuh"

namespace unimoe::routing_detail {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopK = 32;
constexpr int kMaxGroups = 16;  // each group gets at least 2 lanes of the warp
constexpr uint32_t kNoKey = 0;  // below every float key
constexpr double kDeepSeekEpsilon = 1e-20;

static_assert(2 * kMaxGroups <= kWarpSize, "every group has lanes of its own");
static_assert(kMaxTopK <= kWarpSize, "one lane per chosen expert");
static_assert(kMaxExperts <= 32 * kWarpSize, "at most 32 experts per lane");

struct RoutingKernelParams {
  const void* logits;
  const float* bias;  // nullptr: no bias
  int num_tokens;
  int num_experts;
  int top_k;
  int chosen_width;  // the smallest power of two >= top_k (chosen_sum)
  RoutingPolicy policy;
  int n_group;  // 1: no group stage
  int topk_group;
  int lanes_per_group;  // power of two, n_group * lanes_per_group <= 32
  int lanes_per_group_log2;
  int experts_per_group;      // num_experts / n_group
  float inv_experts_per_group;  // 1 / experts_per_group, rounded to nearest
  float inv_num_experts;        // inverse_of(num_experts), for exact_quotient
  float routed_scaling_factor;
  int fixed_choice;  // 1: the decode kernels take choose_deepseek_fixed (routing_fixed.cuh)
  int32_t* topk_ids;
  float* topk_weights;
};

__device__ __forceinline__ float load_logit(const float* row, int e) { return row[e]; }
__device__ __forceinline__ float load_logit(const uint16_t* row, int e) {
  return __uint_as_float(static_cast<uint32_t>(row[e]) << 16);
}

// The same through the read-only path (ld.global.nc), so that the load
// may move above shared-memory stores. Only after pdl_begin, where the
// previous grid's writes are visible (griddepcontrol.wait), and at an
// address that depends on data read after it, so that no compiler moves
// the load above the wait: the octet kernel's candidates, whose experts
// come from its own shared memory.
__device__ __forceinline__ float load_logit_ro(const float* row, int e) { return __ldg(row + e); }
__device__ __forceinline__ float load_logit_ro(const uint16_t* row, int e) {
  return __uint_as_float(static_cast<uint32_t>(__ldg(row + e)) << 16);
}

__device__ __forceinline__ float nan_to_neg_inf(float v) { return isnan(v) ? -INFINITY : v; }

// Order-preserving map of a NaN-free float to uint32 (-inf -> 0x007fffff,
// never kNoKey). -0 is folded into +0 first: they compare equal as floats,
// so they must tie here too.
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// The float order_key came from (-0 comes back as +0).
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// The best (key, index) of the warp: largest key, then lowest index. Every
// lane passes its own best; every lane gets the winning index, and the
// winning key in `top`.
__device__ __forceinline__ int warp_argmax(uint32_t key, int index, uint32_t& top) {
  top = __reduce_max_sync(kFullMask, key);
  const unsigned candidate = key == top ? static_cast<unsigned>(index) : 0xffffffffu;
  return static_cast<int>(__reduce_min_sync(kFullMask, candidate));
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int d = kWarpSize / 2; d > 0; d /= 2) v += __shfl_xor_sync(kFullMask, v, d);
  return v;
}

// The sum of the chosen lanes' v, on each of them: lanes 0..K-1 hold the
// values and the others 0. Only the butterfly levels below `width` (the
// smallest power of two >= K) run: the levels above add exact zeros to these
// lanes, so the sum is warp_sum's bit for bit, in fewer steps (a one-token
// call waits on each level's shuffle; K = 8 skips 2 of 5, K = 1 all).
__device__ __forceinline__ double chosen_sum(double v, int width) {
  for (int d = width / 2; d > 0; d /= 2) v += __shfl_xor_sync(kFullMask, v, d);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int d = kWarpSize / 2; d > 0; d /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, d));
  return v;
}

// The reference's sigmoid: full relative precision on both sides of 0.
__device__ __forceinline__ double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + exp(-x));
  const double e = exp(x);
  return e / (1.0 + e);
}

// DeepSeek's fp32 score, formed as the reference forms it: the fixed fp32
// operation sequence of core/sigmoid_fp32.h, bit for bit the host's.
__device__ __forceinline__ float deepseek_score(float x) { return sigmoid_fp32(x); }

// A fast stand-in for deepseek_score, for filtering only (the octet kernel:
// its keys pick candidates within a margin, whose exact keys then decide):
// 1 / (1 + 2^(-x log2 e)) by the SFU's ex2.approx and rcp.approx, five
// instructions against about 35. NaN gives 0, as deepseek_score does (the
// clamp takes NaN to its bound, where the power overflows to +inf).
// |approx_score(x) - deepseek_score(x)| <= kApproxScoreError for every
// float x: checked on the GPU over all 2^32 inputs
// (RoutingGpu.ApproxScoreIsWithinItsBoundOfEveryScore; 1.79e-7 on the
// H200). The build targets sm_90a alone (CMakeLists.txt), so the SFU
// whose results were checked is the one every launch runs on.
inline constexpr float kApproxScoreError = 0x1p-22f;  // measured: 1.79e-7 (1.5 * 2^-23)
__device__ __forceinline__ float approx_score(float x) {
  const float z = fminf(-x, 126.0f) * 1.44269504f;  // -x log2 e; NaN -> 126 log2 e
  float e, s;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(z));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(1.0f + e));
  return s;
}

// The experts a lane holds in its kPerLane slots.
//   - kRuns: lane l holds l * kPerLane .. l * kPerLane + kPerLane - 1. A
//     lower lane holds lower experts (rounds_by_sorted_runs relies on it), a
//     DeepSeek group is a run of lanes, and a lane's values can come in
//     16-byte loads; but each single load instruction of the warp spreads
//     over kPerLane times the lines.
//   - strided: lane l holds l, l + 32, l + 64, ...: each load instruction of
//     the warp reads 32 consecutive values.
// Measured (session 9 run 3, against the strided layout everywhere): runs
// with single loads cost up to 11% at E = 256 for Renormalize and TopK in
// the cluster variant at T > 8, and gained 3-9% for DeepSeek at T <= 8. So
// the split kernel and the DeepSeek fused kernels use runs, the other fused
// kernels strided slots.
template <int kPerLane, bool kRuns>
struct Slots {
  int lane;
  __device__ __forceinline__ int expert(int j) const {
    return kRuns ? lane * kPerLane + j : lane + kWarpSize * j;
  }
};

// Softmax of the whole row (Default, RenormalizeNaive): its maximum, and
// either the sum of exp(x - max) (finite max) or how many values equal an
// infinite max, which then share the mass.
struct RowSoftmax {
  float max;
  double sum;
  int ties;
};

template <int kPerLane, bool kRuns>
__device__ RowSoftmax row_softmax(const float (&x)[kPerLane], int num_experts,
                                  Slots<kPerLane, kRuns> slots) {
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) m = fmaxf(m, x[j]);  // padding holds -inf
  RowSoftmax r{warp_max(m), 0.0, 0};
  if (isinf(r.max)) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      r.ties += __popc(__ballot_sync(kFullMask, slots.expert(j) < num_experts && x[j] == r.max));
  } else {
    double sum = 0;  // fp32 terms, double sum: rounding stays near 1e-7 for E = 1024
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) sum += expf(x[j] - r.max);  // exp(-inf) = 0
    r.sum = warp_sum(sum);
  }
  return r;
}

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
  // rather than topk_group dependent rounds of warp_argmax (measured, session
  // 8: the group stage took about 1270 cycles of a one-token DeepSeek call).
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
// experts_per_group = lanes_per_group * kPerLane, as E = 256, n_group = 8
// at 8 slots): a lane's own keys are its share of its group, so no shared
// memory is read (session 9 run 6: the split kernel's stores and reads of
// the keys there were 80% excess wavefronts at DeepSeekV3 E=256 T=16384).
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

// The lanes of this lane's aligned segment of `width` (a power of two).
__device__ __forceinline__ unsigned segment_lanes(int width) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const unsigned ones = width >= kWarpSize ? kFullMask : (1u << width) - 1u;
  return ones << (lane & ~(width - 1));
}

// w / sum(w) over the chosen lanes; an all-zero w stays zero.
__device__ __forceinline__ double renormalize(double w, int width) {
  const double sum = chosen_sum(w, width);
  return sum == 0 ? w : w / sum;
}

// The weight of the expert this lane chose (lanes >= K pass 0 and take part
// in the warp sums only). x: its logit, NaN already -inf. A kernel built for
// the DeepSeek policies holds only their case, the others only theirs: the
// routing code runs once per call from a cold instruction cache, so code a
// kernel never runs still costs it fetch time.
// kSegments: the warp holds 32 / chosen_width tokens, token g's k-th
// expert on lane g * chosen_width + k (the split kernel's batched weights);
// every sum, maximum and count stays within a token's lanes. Without it,
// one token on lanes 0..K-1.
template <bool kDeepSeek, bool kSegments = false>
__device__ inline double chosen_weight(const RoutingKernelParams& p, const RowSoftmax& row,
                                       float x, bool active) {
  if constexpr (kDeepSeek) {
    const double s = active ? sigmoid(x) : 0.0;
    return s / (chosen_sum(s, p.chosen_width) + kDeepSeekEpsilon) * p.routed_scaling_factor;
  } else {
    switch (p.policy) {
      case RoutingPolicy::Default:
      case RoutingPolicy::RenormalizeNaive: {
        double w = 0;
        if (active) {
          w = isinf(row.max) ? (x == row.max ? 1.0 / row.ties : 0.0)
                             : exp(static_cast<double>(x) - row.max) / row.sum;
        }
        return p.policy == RoutingPolicy::RenormalizeNaive ? renormalize(w, p.chosen_width) : w;
      }
      case RoutingPolicy::Renormalize: {
        // Softmax over the chosen logits; the token's first lane holds the
        // largest, m.
        if constexpr (kSegments) {
          // m differs between tokens, so the ballot is taken on every lane.
          const float m = __shfl_sync(kFullMask, x, 0, p.chosen_width);
          const bool top = active && x == m;
          const unsigned tied = __ballot_sync(kFullMask, top) & segment_lanes(p.chosen_width);
          if (isinf(m)) return top ? 1.0 / __popc(tied) : 0.0;
          const double v = active ? exp(static_cast<double>(x) - m) : 0.0;
          return v / chosen_sum(v, p.chosen_width);
        }
        const float m = __shfl_sync(kFullMask, x, 0);
        if (isinf(m)) {
          const int ties = __popc(__ballot_sync(kFullMask, active && x == m));
          return active && x == m ? 1.0 / ties : 0.0;
        }
        const double v = active ? exp(static_cast<double>(x) - m) : 0.0;
        return v / chosen_sum(v, p.chosen_width);
      }
      case RoutingPolicy::TopK:
        return x;
      case RoutingPolicy::Sigmoid:
      case RoutingPolicy::TopKSigmoid:
      case RoutingPolicy::Llama4:
        return sigmoid(x);
      case RoutingPolicy::SigmoidRenorm:
        return renormalize(active ? sigmoid(x) : 0.0, p.chosen_width);
      case RoutingPolicy::DeepSeekV3:
      case RoutingPolicy::MiniMax2:
        break;  // kDeepSeek kernels
    }
    return 0;
  }
}

// What lane k < K of a warp holds after routing a token: its k-th expert,
// best first, and that expert's weight.
struct TokenChoice {
  int expert;
  float weight;
};

// What lane k < K holds between choosing a token's experts and weighing
// them: its k-th expert, that expert's logit where the selection key gave it
// back (the other policies load it when weighing), and the row's softmax
// (Default, RenormalizeNaive).
struct TokenExperts {
  int expert;
  float x;
  RowSoftmax softmax;
};

// DeepSeek's selection key of one expert, c = sigmoid(x) + bias, NaN as
// -inf; x is the logit with NaN already -inf.
__device__ __forceinline__ float deepseek_key(float x, float bias) {
  return nan_to_neg_inf(deepseek_score(x) + bias);
}

// The values of a lane's slots from a row of E (global or shared memory),
// as fp32 (bf16 widened exactly); slots at or past E get `past`.
// kWideLoads, with runs (the split kernel, throughput-bound at large T; and
// staged DeepSeek keys in shared memory): where the row is 16-byte aligned
// and E a multiple of a 16-byte load, a lane's run comes in whole 16-byte
// loads. Otherwise one load a slot.
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }

template <bool kWideLoads, typename T, int kPerLane, bool kRuns>
__device__ __forceinline__ void load_slots(const T* row, int num_experts, Slots<kPerLane, kRuns> slots,
                                           float past, float (&out)[kPerLane]) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // values in one 16-byte load
  if constexpr (kRuns && kWideLoads && kPerLane % kVec == 0) {
    if (num_experts % kVec == 0 && (reinterpret_cast<uintptr_t>(row) & 15u) == 0) {
#pragma unroll
      for (int v = 0; v < kPerLane / kVec; ++v) {
        const int e = slots.expert(v * kVec);  // the whole load lies before E or past it
        uint4 u = make_uint4(0, 0, 0, 0);
        if (e < num_experts) u = *reinterpret_cast<const uint4*>(row + e);
        const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          float value;
          if constexpr (sizeof(T) == 4) {
            value = __uint_as_float(words[i]);
          } else {  // two bf16 a word, the lower one first
            value = __uint_as_float(i % 2 == 0 ? words[i / 2] << 16 : words[i / 2] & 0xffff0000u);
          }
          out[v * kVec + i] = e < num_experts ? value : past;
        }
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = slots.expert(j);
    out[j] = e < num_experts ? widen(row[e]) : past;
  }
}

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

// Each lane sorts its slots once (sort_descending on (key, slot), the
// lower slot first among equal keys); then take_heads.
// Counted from the SASS (not profiled): about 150 instructions to sort 8
// slots, then about 30 a round against the tree's 45, so fewer in all from
// K = 4 at 8 slots. Measured only together with the runs layout (session 9
// run 2, the split kernel against strided slots and the tree): Renormalize
// E=128 K=8 T=16384 23.75 -> 23.08 us. Profiled (session 13 run 3,
// DeepSeekV3 E=256 K=8 T=16384): the sort 240 instructions a token, the
// rounds 32 each, half of them the winner's shift.
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
// dependent rounds, for the decode kernels (session 17 run 2, each token
// chosen twice in one launch, the second time from a warm instruction
// cache: choosing took about 2,100 cycles at Renormalize E=128 K=8, 2,500
// at E=256, both with the logits' load, and 3,500 at DeepSeekV3 E=256;
// this way cut the first by about 280 only; its gain grows with the slots
// a lane and with K: routing_shape::threshold_serves):
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
// stores (a lane's other slots go to one of 16 spare pairs past it),
// padded to 32 pairs, and each candidate's rank (the count of larger
// pairs: a larger key, or an equal key and a lower expert) from a fixed run
// of 16-byte loads with independent counts. area: 48 pairs of the warp's
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
    area[in ? place : kWarpSize + lane % 16] = key_expert_pair(key[j], slots.expert(j));
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
// form of the policies without groups at routing_shape::kRankedSlots
// strided slots a lane (E = 65..128), where rounds_by_threshold's own list
// and ranks were no faster than the rounds (session 17: its fixed steps
// cost about what they saved at 4 slots). The lanes'
// bests are counted with four independent sums. Returns false, as
// rounds_by_threshold does, where fewer than K lanes hold a key or more
// than kWarpSize keys reach the threshold. area: rank_candidates' 48 pairs.
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

// rounds_by_threshold's area, 32 pairs in `keys` (rank_candidates' 48): a
// warp's kPerLane * 32 words of group keys, or a token's E > 128 staged
// DeepSeek keys, 16-byte aligned up (the kernels take it at
// kThresholdMinSlots slots a lane, or kRankedSlots: 128 words).
// Aligned by pointer arithmetic on `keys`, not through an integer: an
// integer cast loses the shared state space, and the list's loads and
// stores became generic ones (session 19, the wide choice's first form).
__device__ __forceinline__ uint64_t* threshold_area(float* keys) {
  const int words_past = static_cast<int>((reinterpret_cast<uintptr_t>(keys) >> 2) & 3u);
  return reinterpret_cast<uint64_t*>(keys + ((4 - words_past) & 3));
}

// Whether rounds_by_kept_halves serves a call (host and device): each group
// a run of whole lanes of kPerLane slots, and the kept groups' lanes at
// most half the warp.
__host__ __device__ inline bool compacts_kept_lanes(const RoutingKernelParams& p, int per_lane) {
  return p.n_group > 1 && p.experts_per_group == p.lanes_per_group * per_lane &&
         per_lane % 2 == 0 && (p.topk_group << p.lanes_per_group_log2) <= kWarpSize / 2;
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

// ------------------------------------------------------------------ host ----

// Experts per lane a kernel is instantiated for: a power of two, 1..32.
inline int slots_per_lane(int num_experts) { return routing_shape::slots_for_experts(num_experts); }
static_assert(kMaxExperts / kWarpSize == 32, "slots_for_experts stops at 32 slots");

// Calls f(std::integral_constant<int, S>{}) with S = slots_per_lane(E), so
// that a launcher picks the kernel instantiated for its slots.
template <class F>
void with_slots_per_lane(int num_experts, F&& f) {
  switch (slots_per_lane(num_experts)) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    default: f(std::integral_constant<int, 32>{}); break;
  }
}

inline bool is_deepseek(RoutingPolicy p) {
  return p == RoutingPolicy::DeepSeekV3 || p == RoutingPolicy::MiniMax2;
}

// The config limits the routing code is built for (validate() refuses the
// rest earlier); throws std::invalid_argument, the message prefixed by `who`.
inline void check_routing_config(const RoutingParams& params, const std::string& who) {
  auto require = [&](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument(who + ": " + message);
  };
  const RoutingConfig& c = params.config;
  const int n_group = c.policy == RoutingPolicy::DeepSeekV3 ? c.n_group : 1;
  require(params.num_tokens >= 0, "num_tokens must be >= 0");
  require(c.num_experts >= 1 && c.num_experts <= kMaxExperts,
          "num_experts must be 1.." + std::to_string(kMaxExperts));
  require(c.top_k >= 1 && c.top_k <= kMaxTopK && c.top_k <= c.num_experts,
          "top_k must be 1..min(num_experts, " + std::to_string(kMaxTopK) + ")");
  require(c.policy != RoutingPolicy::Llama4 || c.top_k == 1, "Llama4 needs top_k = 1");
  require(n_group >= 1 && n_group <= kMaxGroups && c.num_experts % n_group == 0,
          "n_group must be 1.." + std::to_string(kMaxGroups) + " and divide num_experts");
  if (n_group > 1) {
    require(c.num_experts / n_group >= 2, "groups need at least 2 experts");
    require(c.topk_group >= 1 && c.topk_group <= n_group, "topk_group must be 1..n_group");
    require(c.top_k <= c.topk_group * (c.num_experts / n_group),
            "top_k exceeds the experts of the kept groups");
  }
  require(!(is_deepseek(c.policy) && c.has_bias) || params.bias != nullptr,
          "has_bias is set but bias is null");
}

// The kernel's view of checked params.
inline RoutingKernelParams make_routing_kernel_params(const RoutingParams& params) {
  const RoutingConfig& c = params.config;
  const bool deepseek = is_deepseek(c.policy);
  const int n_group = c.policy == RoutingPolicy::DeepSeekV3 ? c.n_group : 1;
  RoutingKernelParams p{};
  p.logits = params.logits;
  p.bias = deepseek && c.has_bias ? params.bias : nullptr;
  p.num_tokens = params.num_tokens;
  p.num_experts = c.num_experts;
  p.top_k = c.top_k;
  p.chosen_width = 1;
  while (p.chosen_width < c.top_k) p.chosen_width *= 2;
  p.policy = c.policy;
  p.n_group = n_group;
  p.topk_group = n_group > 1 ? c.topk_group : 1;
  p.lanes_per_group = kWarpSize;
  p.lanes_per_group_log2 = 5;
  while (p.lanes_per_group * n_group > kWarpSize) {
    p.lanes_per_group /= 2;
    --p.lanes_per_group_log2;
  }
  p.experts_per_group = c.num_experts / n_group;
  p.inv_experts_per_group = inverse_group_size(p.experts_per_group);
  p.inv_num_experts = inverse_of(c.num_experts);
  p.routed_scaling_factor = c.routed_scaling_factor;
  p.topk_ids = params.topk_ids;
  p.topk_weights = params.topk_weights;
  return p;
}

}  // namespace unimoe::routing_detail

namespace unimoe {

// The split chain's DeepSeek routing kernel of eight lanes a token
// (routing_octets.cu), for the calls routing_shape::split_takes_octets
// allows (the routing plan decides). `filter`: its filter mode (16-byte
// aligned logits only). `counts` (nullptr: none): the permute's chunk
// counts to write as well, where the plan has it count the rows.
void launch_routing_octets(const routing_detail::RoutingKernelParams& p, bool bf16_logits,
                           bool filter, const PermuteCounts* counts, KernelStream stream);

}  // namespace unimoe
