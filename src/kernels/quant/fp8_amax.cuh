// The amax reductions, the scale rule and the element encoder that every
// kernel quantizing to e4m3 shares (fp8_quant.cu for activations,
// fp8_weights.cu for weights, the FP8 stream GEMM for the inputs it
// quantizes itself): the rule of docs/quantization.md, scale = amax / 448
// in fp32 (1 when that is not > 0), code = e4m3(x / scale) with one IEEE
// division. fmaxf skips NaN and max is exact, so the order of a reduction
// does not change its result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/e4m3.h"

namespace unimoe::fp8_amax {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kE4m3Max = 448.0f;

// The scale of a block whose largest magnitude is amax: amax / 448, 1 when
// that is not > 0 (amax 0, or a quotient that underflows).
__device__ __forceinline__ float fp8_scale(float amax) {
  const float scale = __fdiv_rn(amax, kE4m3Max);
  return scale > 0.0f ? scale : 1.0f;
}

// The warp's maximum of v, returned to every lane.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int d = kWarpSize / 2; d > 0; d /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, d));
  return v;
}

// The CTA's maximum of v (>= 0) over its kWarps warps, returned to every
// thread. Every thread calls it, once per kernel (its shared array is not
// reused).
template <int kWarps>
__device__ __forceinline__ float block_max(float v) {
  __shared__ float warp_maxima[kWarps];
  v = warp_max(v);
  if (threadIdx.x % kWarpSize == 0) warp_maxima[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  float m = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, warp_maxima[w]);
  return m;
}

// ---- Four consecutive values at a time (a lane's share of a 128-wide group
// is 4 values: 32 lanes x 4).
constexpr int kRowVec = 4;

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Four consecutive values of the input, as floats: element 4 * vec onwards
// of a bf16 array (8 bytes) or of an fp32 one (16 bytes), in global or
// shared memory.
struct Four {
  float v[kRowVec];
};
__device__ __forceinline__ Four load4(const uint16_t* x, int64_t vec) {
  const uint2 w = reinterpret_cast<const uint2*>(x)[vec];
  return {{bf16_lo(w.x), bf16_hi(w.x), bf16_lo(w.y), bf16_hi(w.y)}};
}
__device__ __forceinline__ Four load4(const float* x, int64_t vec) {
  const float4 w = reinterpret_cast<const float4*>(x)[vec];
  return {{w.x, w.y, w.z, w.w}};
}

__device__ __forceinline__ float abs_max4(float m, const Four& f) {
#pragma unroll
  for (int i = 0; i < kRowVec; ++i) m = fmaxf(m, fabsf(f.v[i]));
  return m;
}

// Four codes of consecutive columns, the first in the lowest byte.
__device__ __forceinline__ uint32_t encode4(const Four& f, float scale) {
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < kRowVec; ++i)
    packed |= static_cast<uint32_t>(encode_e4m3(__fdiv_rn(f.v[i], scale))) << (8 * i);
  return packed;
}

}  // namespace unimoe::fp8_amax
