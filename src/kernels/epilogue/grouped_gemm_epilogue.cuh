// What the grouped GEMM applies to its fp32 accumulators before the bf16
// store: nothing (GEMM2), a gated activation of a (gate, up) pair, or the
// pointwise ReLU2. The formulas live in kernels/activation.cuh.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/epilogue/activation.cuh"
#include "unimoe/unimoe.h"

namespace unimoe {

enum class GemmEpilogue : int { Identity, SwiGLU, GeGLU, SwiGLUOai, ReLU2 };

// GEMM1's epilogue for a config's activation (host code; every backend's
// GEMM1 applies it). Throws std::invalid_argument for a value outside the enum.
inline GemmEpilogue gemm1_epilogue(Activation a) {
  switch (a) {
    case Activation::SwiGLU: return GemmEpilogue::SwiGLU;
    case Activation::GeGLU: return GemmEpilogue::GeGLU;
    case Activation::SwiGLUOai: return GemmEpilogue::SwiGLUOai;
    case Activation::ReLU2: return GemmEpilogue::ReLU2;
  }
  throw std::invalid_argument("gemm1_epilogue: unknown activation " +
                              std::to_string(static_cast<int>(a)));
}

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
