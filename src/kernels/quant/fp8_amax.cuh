// The amax reductions and the scale rule the FP8 quantize kernels share
// (fp8_quant.cu for activations, fp8_weights.cu for weights): the rule of
// docs/quantization.md, scale = amax / 448 in fp32 (1 when that is not > 0).
// fmaxf skips NaN and max is exact, so the order of a reduction does not
// change its result.
#pragma once

#include <cuda_runtime.h>

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

}  // namespace unimoe::fp8_amax
