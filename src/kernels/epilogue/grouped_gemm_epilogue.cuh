// What the grouped GEMM applies to its fp32 accumulators before the bf16
// store: nothing (GEMM2), a gated activation of a (gate, up) pair, or the
// pointwise ReLU2. The formulas live in kernels/activation.cuh.
#pragma once

#include <cuda_runtime.h>

#include "kernels/epilogue/activation.cuh"

namespace unimoe {

enum class GemmEpilogue : int { Identity, SwiGLU, GeGLU, SwiGLUOai, ReLU2 };

// Gated epilogues read a gate and an up value per output column.
__host__ __device__ constexpr bool is_gated(GemmEpilogue e) {
  return e == GemmEpilogue::SwiGLU || e == GemmEpilogue::GeGLU || e == GemmEpilogue::SwiGLUOai;
}

__device__ __forceinline__ float gated_activation(GemmEpilogue e, float g, float u, float alpha,
                                                  float limit) {
  switch (e) {
    case GemmEpilogue::SwiGLU: return swiglu(g, u);
    case GemmEpilogue::GeGLU: return geglu(g, u);
    case GemmEpilogue::SwiGLUOai: return swiglu_oai(g, u, alpha, limit);
    default: return g;  // not reached: the launcher sends only gated epilogues here
  }
}

__device__ __forceinline__ float pointwise_activation(GemmEpilogue e, float v) {
  return e == GemmEpilogue::ReLU2 ? relu2(v) : v;
}

}  // namespace unimoe
