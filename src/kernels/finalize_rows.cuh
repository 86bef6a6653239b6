// The finalize's arithmetic for one 8-column chunk of one token, shared by
// the finalize kernel (finalize.cu) and GEMM2's fused finalize tail (below),
// so both give the same bits:
//   out[col..col+7] = sum over k = 0..K-1, in that order, of
//                     weights[k] * (y[rows[k], col..col+7] + b2[experts[k], col..])
// rows of -1 (off rank) skipped; fp32 fmaf in k order, one bf16 rounding.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/grouped_gemm.cuh"

namespace unimoe {

inline constexpr int kFinalizeVector = 8;  // bf16 per 16-byte load

// y is read through L2 (ld.global.cg): in the fused tail, other CTAs of the
// same grid wrote it. b2 (with experts) may be nullptr.
__device__ __forceinline__ uint4 weighted_row_sum(const uint16_t* y, int hidden, int col, int top_k,
                                                  const int* rows, const float* weights,
                                                  const float* b2, const int* experts) {
  float acc[kFinalizeVector] = {};
  for (int k = 0; k < top_k; ++k) {
    const int row = rows[k];
    if (row < 0) continue;
    const float w = weights[k];
    const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(y + static_cast<size_t>(row) * hidden + col));
    const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < kFinalizeVector / 2; ++i) {
      const float2 f = __bfloat1622float2(v[i]);
      acc[2 * i] = fmaf(w, f.x, acc[2 * i]);
      acc[2 * i + 1] = fmaf(w, f.y, acc[2 * i + 1]);
    }
    if (b2 != nullptr) {
      const float* bias = b2 + static_cast<size_t>(experts[k]) * hidden + col;
#pragma unroll
      for (int i = 0; i < kFinalizeVector; ++i) acc[i] = fmaf(w, bias[i], acc[i]);
    }
  }
  uint4 packed;
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < kFinalizeVector / 2; ++i) out[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  return packed;
}

// GEMM2's fused finalize tail (FinalizeTail, grouped_gemm.cuh), run by every
// CTA of the GEMM2 grid after its tile (or at once, if it had none): CTAs
// of column block `block_n` count themselves in; the last of the
// `ctas_per_block` writes out[t, col0 .. col0 + cols) for every token.
// Each thread's y stores are fenced before the count; the last CTA fences
// after it, so it sees every tile's rows.
__device__ __forceinline__ void finalize_tail(const FinalizeTail& f, const uint16_t* y, int hidden,
                                              int block_n, int ctas_per_block, int col0, int cols) {
  __threadfence();
  __syncthreads();  // every thread's stores fenced before the CTA counts itself in
  int last = 0;
  if (threadIdx.x == 0) {
    last = atomicAdd(&f.counters[block_n], 1) == ctas_per_block - 1;
    if (last) {
      f.counters[block_n] = 0;  // at rest again for the next call
      __threadfence();
    }
  }
  if (!__syncthreads_or(last)) return;
  const int chunks = (min(cols, hidden - col0) + kFinalizeVector - 1) / kFinalizeVector;
  if (chunks <= 0) return;
  for (int i = threadIdx.x; i < f.num_tokens * chunks; i += blockDim.x) {
    const int token = i / chunks;
    const int col = col0 + (i - token * chunks) * kFinalizeVector;
    const size_t expanded = static_cast<size_t>(token) * f.top_k;
    *reinterpret_cast<uint4*>(f.out + static_cast<size_t>(token) * hidden + col) =
        weighted_row_sum(y, hidden, col, f.top_k, f.expanded_to_permuted + expanded,
                         f.topk_weights + expanded, nullptr, nullptr);
  }
}

}  // namespace unimoe
