// The activations in fp32, one definition for every kernel that applies them
// (the mma path's GEMM1 epilogue, the CUTLASS path's activation kernel), with
// the formulas of the CPU reference (src/ref/activation.cpp). A NaN input
// stays NaN: every clamp is a comparison that lets NaN through, never
// fminf/fmaxf, which would drop it.
#pragma once

#include <cuda_runtime.h>

namespace unimoe {

__device__ __forceinline__ float sigmoid_f32(float z) { return 1.0f / (1.0f + expf(-z)); }

__device__ __forceinline__ float swiglu(float g, float u) { return g * sigmoid_f32(g) * u; }

// The exact (erf) gelu times u. 1 + erf(x) is written erfc(-x), which keeps
// its relative accuracy where erf(x) is close to -1 (g below about -3).
__device__ __forceinline__ float geglu(float g, float u) {
  return 0.5f * g * erfcf(g * -0.70710678118654752f) * u;
}

// gpt-oss: the gate is clamped from above only, the up value on both sides.
__device__ __forceinline__ float swiglu_oai(float g, float u, float alpha, float limit) {
  const float gc = limit < g ? limit : g;
  const float uc = u < -limit ? -limit : (limit < u ? limit : u);
  return gc * sigmoid_f32(alpha * gc) * (uc + 1.0f);
}

__device__ __forceinline__ float relu2(float v) {
  const float r = v < 0.0f ? 0.0f : v;
  return r * r;
}

}  // namespace unimoe
