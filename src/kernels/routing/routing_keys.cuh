// The routing kernels' limits and parameters, and the per-expert values one
// warp works on: logit loads, order-preserving keys, warp reductions, the
// sigmoid scores, the slots' layout (Slots) and the row softmax. Part of
// routing_device.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

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
// Measured on an H200 (against the strided layout everywhere): runs with
// single loads cost up to 11% at E = 256 for Renormalize and TopK in the
// cluster variant at T > 8, and gained 3-9% for DeepSeek at T <= 8. So the
// split kernel and the DeepSeek fused kernels use runs, the other fused
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

}  // namespace unimoe::routing_detail
