// What the grouped GEMM applies to its fp32 accumulators before the bf16
// store: nothing (GEMM2), a gated activation of a (gate, up) pair, or the
// pointwise ReLU2. A NaN input stays NaN, as in the CPU reference
// (src/ref/activation.cpp): every clamp below is written as a comparison that
// lets NaN through, never with fminf/fmaxf, which would drop it.
#pragma once

#include <cuda_runtime.h>

namespace unimoe {

enum class GemmEpilogue : int { Identity, SwiGLU, GeGLU, SwiGLUOai, ReLU2 };

// Gated epilogues read a gate and an up value per output column.
__host__ __device__ constexpr bool is_gated(GemmEpilogue e) {
  return e == GemmEpilogue::SwiGLU || e == GemmEpilogue::GeGLU || e == GemmEpilogue::SwiGLUOai;
}

__device__ __forceinline__ float sigmoid_f32(float z) { return 1.0f / (1.0f + expf(-z)); }

__device__ __forceinline__ float gated_activation(GemmEpilogue e, float g, float u, float alpha,
                                                  float limit) {
  switch (e) {
    case GemmEpilogue::SwiGLU:
      return g * sigmoid_f32(g) * u;
    case GemmEpilogue::GeGLU:
      // The exact (erf) gelu, not the tanh approximation.
      return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f)) * u;
    case GemmEpilogue::SwiGLUOai: {
      // gpt-oss: the gate is clamped from above only, the up value on both sides.
      const float gc = limit < g ? limit : g;
      const float uc = u < -limit ? -limit : (limit < u ? limit : u);
      return gc * sigmoid_f32(alpha * gc) * (uc + 1.0f);
    }
    default:
      return g;  // not reached: the launcher sends only gated epilogues here
  }
}

__device__ __forceinline__ float pointwise_activation(GemmEpilogue e, float v) {
  if (e == GemmEpilogue::ReLU2) {
    const float r = v < 0.0f ? 0.0f : v;
    return r * r;
  }
  return v;
}

}  // namespace unimoe
