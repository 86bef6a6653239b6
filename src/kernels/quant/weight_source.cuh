// Where the weight quantize kernels (fp8_weights.cuh, fp4_weights.cuh) read
// their values from: a bf16 device array [E, rows, cols], or the synthetic
// values of launch_fill_bf16 (kernels/common/fill.cuh) generated on the fly,
// so that a layer's weights never exist in bf16 on the device (a
// DeepSeek-V3 layer's would take 15 GB). The device loaders give 8
// consecutive values of the whole array from an index that is a multiple
// of 8.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/fill.cuh"

namespace unimoe {

// Element i of the whole [E, rows, cols] array (64-bit i) is:
//   Bf16:      bf16[i];
//   Synthetic: the bf16 value launch_fill_bf16(out, E * rows * cols, seed,
//              scale) writes at i (fill_bf16_element(seed, i, scale)).
enum class WeightSourceKind { Bf16, Synthetic };

struct WeightSource {
  WeightSourceKind kind = WeightSourceKind::Bf16;
  const uint16_t* bf16 = nullptr;  // Bf16: [E, rows, cols], 16-byte aligned
  uint64_t seed = 0;               // Synthetic
  float scale = 0.0f;              // Synthetic
};

inline WeightSource bf16_weight_source(const uint16_t* values) {
  return {WeightSourceKind::Bf16, values, 0, 0.0f};
}
inline WeightSource synthetic_weight_source(uint64_t seed, float scale) {
  return {WeightSourceKind::Synthetic, nullptr, seed, scale};
}

#if defined(__CUDACC__)
namespace weight_source {

constexpr int kVec = 8;  // values a load gives: 16 bytes of bf16

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// The bf16 array: 8 values from one 16-byte load.
struct Bf16Loader {
  const uint4* values;  // [E * rows * cols / 8]
  __device__ __forceinline__ void load(int64_t i, float (&v)[kVec]) const {
    const uint4 w = __ldg(values + i / kVec);
    v[0] = bf16_lo(w.x);
    v[1] = bf16_hi(w.x);
    v[2] = bf16_lo(w.y);
    v[3] = bf16_hi(w.y);
    v[4] = bf16_lo(w.z);
    v[5] = bf16_hi(w.z);
    v[6] = bf16_lo(w.w);
    v[7] = bf16_hi(w.w);
  }
};

// The values launch_fill_bf16(seed, scale) writes, made on the fly.
struct SyntheticLoader {
  uint64_t seed;
  float scale;
  __device__ __forceinline__ void load(int64_t i, float (&v)[kVec]) const {
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      v[k] = __uint_as_float(static_cast<uint32_t>(fill_bf16_element(seed, i + k, scale)) << 16);
  }
};

}  // namespace weight_source
#endif
}  // namespace unimoe
