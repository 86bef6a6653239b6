// The element steps of the FP8 activation quantization (the rule of
// fp8_quant.cuh), shared by the quantize kernels (fp8_quant.cu) and by the
// GEMMs that quantize their own input rows (the FP8 stream kernel's one-token
// path): four values at a time, their largest magnitude, their four codes.
// One definition, so a GEMM that quantizes a row itself makes the codes and
// scales the quantize kernels make, bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/e4m3.h"
#include "kernels/quant/fp8_amax.cuh"

namespace unimoe::fp8_encode {

constexpr int kVec = 4;          // values a step
constexpr int kGroupCols = 128;  // columns of one scale of the row form
static_assert(kGroupCols == fp8_amax::kWarpSize * kVec, "a warp covers one 128-column group");

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Four consecutive values of the input, as floats: element 4 * vec onwards
// of a bf16 array (8 bytes) or of an fp32 one (16 bytes), global or shared.
struct Four {
  float v[kVec];
};
__device__ __forceinline__ Four load4(const uint16_t* x, int64_t vec) {
  const uint2 w = reinterpret_cast<const uint2*>(x)[vec];
  return {{bf16_lo(w.x), bf16_hi(w.x), bf16_lo(w.y), bf16_hi(w.y)}};
}
__device__ __forceinline__ Four load4(const float* x, int64_t vec) {
  const float4 w = reinterpret_cast<const float4*>(x)[vec];
  return {{w.x, w.y, w.z, w.w}};
}

// max(m, |v|) over the four; fmaxf skips NaN.
__device__ __forceinline__ float abs_max4(float m, const Four& f) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) m = fmaxf(m, fabsf(f.v[i]));
  return m;
}

// Four codes of consecutive columns, the first in the lowest byte: one IEEE
// division by the scale each, then the integer encoder of core/e4m3.h.
__device__ __forceinline__ uint32_t encode4(const Four& f, float scale) {
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < kVec; ++i)
    packed |= static_cast<uint32_t>(encode_e4m3(__fdiv_rn(f.v[i], scale))) << (8 * i);
  return packed;
}

// How a row quantized in shared memory takes its scales.
enum class RowScale : int {
  kGroups = 0,  // one per 128 columns: amax / 448 of the group (FP8Block128)
  kGiven = 1,   // the one scale given, for every value (FP8PerTensor, static)
  kRow = 2,     // one over the whole row: amax / 448 of the row (FP8PerTensor,
                // dynamic, where the tensor is one row)
  kMaxima = 3,  // one from given maxima: amax / 448 of the largest of them (FP8PerTensor,
                // dynamic, the maxima of the tensor's parts taken where they were made)
};

// The value at column c of a raw row in shared memory, as a float.
__device__ __forceinline__ float value_at(const uint16_t* x, int c) {
  return __uint_as_float(static_cast<uint32_t>(x[c]) << 16);
}
__device__ __forceinline__ float value_at(const float* x, int c) { return x[c]; }

// One row of `cols` values (a positive multiple of 128) in shared memory,
// bf16 or fp32, to e4m3 codes in shared memory (codes[c] for column c) and
// a scale per 128-column group at scales[g * scale_stride]: the codes and
// scales launch_quantize_fp8_rows (kGroups) or launch_quantize_fp8_tensor
// (kGiven with that static scale; kRow, its dynamic scale over a one-row
// tensor; kMaxima, its dynamic scale, from `count` maxima at given[0..count)
// that cover the tensor) write for that row. Every thread of the CTA (kWarps warps) calls
// it; it ends with __syncthreads(), after which codes and scales may be
// read. Written for few registers (it runs inside GEMM kernels with their
// weight loads in flight): the maxima four values at a time, the codes one
// value at a time (the same division and encoder as encode4).
template <int kWarps, typename In>
__device__ __forceinline__ void quantize_row_shared(const In* raw, int cols, uint8_t* codes,
                                                    float* scales, int scale_stride,
                                                    RowScale mode, const float* given,
                                                    int count = 0) {
  constexpr int kThreads = kWarps * fp8_amax::kWarpSize;
  const int lane = threadIdx.x % fp8_amax::kWarpSize, warp = threadIdx.x / fp8_amax::kWarpSize;
  const int groups = cols / kGroupCols;
  if (mode == RowScale::kGroups) {
    // One warp a group, 4 values a lane: the row kernel's (row, group) warp.
#pragma unroll 1
    for (int g = warp; g < groups; g += kWarps) {
      const int vec = g * (kGroupCols / kVec) + lane;
      const float scale = fp8_amax::fp8_scale(fp8_amax::warp_max(abs_max4(0.0f, load4(raw, vec))));
      if (lane == 0) scales[g * scale_stride] = scale;
#pragma unroll 1
      for (int i = 0; i < kVec; ++i)
        codes[kVec * vec + i] = encode_e4m3(__fdiv_rn(value_at(raw, kVec * vec + i), scale));
    }
    __syncthreads();
    return;
  }
  float scale;
  if (mode == RowScale::kGiven) {
    scale = *given;
  } else {
    __shared__ float warp_maxima[kWarps];
    float m = 0.0f;
    if (mode == RowScale::kMaxima) {
#pragma unroll 1
      for (int i = threadIdx.x; i < count; i += kThreads) m = fmaxf(m, given[i]);
    } else {
#pragma unroll 1
      for (int vec = threadIdx.x; vec < cols / kVec; vec += kThreads) m = abs_max4(m, load4(raw, vec));
    }
    m = fp8_amax::warp_max(m);
    if (lane == 0) warp_maxima[warp] = m;
    __syncthreads();
    m = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, warp_maxima[w]);
    scale = fp8_amax::fp8_scale(m);
  }
#pragma unroll 1
  for (int c = threadIdx.x; c < cols; c += kThreads)
    codes[c] = encode_e4m3(__fdiv_rn(value_at(raw, c), scale));
  for (int g = threadIdx.x; g < groups; g += kThreads) scales[g * scale_stride] = scale;
  // Also keeps the next call's warp_maxima writes behind this call's reads.
  __syncthreads();
}

}  // namespace unimoe::fp8_encode
