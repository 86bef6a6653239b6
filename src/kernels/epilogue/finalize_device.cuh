// The finalize's arithmetic on the device, shared by the finalize kernel
// (finalize.cu) and by the decode GEMM2 kernels that fold it into their last
// CTA (FinalizeFold, kernels/gemm/grouped_gemm.cuh), so that both give the
// same bits: for one token and 8 consecutive columns,
//   out = sum over k = 0..K-1, in that order, of w[k] * y[row(k)] (+ w[k] * b2[expert(k)])
// in fp32 fmaf steps, rows of -1 (off rank) skipped, one bf16 rounding.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/common.cuh"
#include "kernels/gemm/grouped_gemm.cuh"

namespace unimoe::finalize_device {

constexpr int kVector = 8;  // bf16 per 16-byte load: the columns of one step
constexpr int kBatch = 8;   // rows of a token loaded together

// One token's routing, read through `Rows`: row(k) (the permuted row, or
// -1), weight(k) and expert(k) (the local expert, read only where b2 is
// set and row(k) >= 0). kFromL2: y is read with ld.global.cg (a CTA that
// reads rows other CTAs of its own grid wrote).
template <bool kFromL2, typename Rows>
__device__ __forceinline__ uint4 token_columns(const FinalizeParams& p, const Rows& rows, int col) {
  // A token's rows are read kBatch at a time, every load issued before the
  // first add, so a thread has up to kBatch loads in flight instead of one;
  // the adds keep k order, so the bits do not change.
  float acc[kVector] = {};
  for (int k0 = 0; k0 < p.top_k; k0 += kBatch) {
    uint4 raw[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int row = k0 + j < p.top_k ? rows.row(k0 + j) : -1;
      const uint4* src = reinterpret_cast<const uint4*>(p.y + static_cast<size_t>(row) * p.hidden + col);
      if constexpr (kFromL2)
        raw[j] = row >= 0 ? __ldcg(src) : make_uint4(0, 0, 0, 0);
      else
        raw[j] = row >= 0 ? *src : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int k = k0 + j;
      if (k >= p.top_k || rows.row(k) < 0) continue;
      const float w = rows.weight(k);
      const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(&raw[j]);
#pragma unroll
      for (int i = 0; i < kVector / 2; ++i) {
        const float2 f = __bfloat1622float2(v[i]);
        acc[2 * i] = fmaf(w, f.x, acc[2 * i]);
        acc[2 * i + 1] = fmaf(w, f.y, acc[2 * i + 1]);
      }
      if (p.b2) {
        const float* bias = p.b2 + static_cast<size_t>(rows.expert(k)) * p.hidden + col;
#pragma unroll
        for (int i = 0; i < kVector; ++i) acc[i] = fmaf(w, bias[i], acc[i]);
      }
    }
  }
  uint4 packed;
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < kVector / 2; ++i) out[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  return packed;
}

// The local expert of an id that the permute found local (row >= 0); the
// unsigned difference keeps any other id (INT_MIN, say) from overflowing.
__device__ __forceinline__ int local_expert(const FinalizeParams& p, int32_t id) {
  return static_cast<int>(static_cast<unsigned>(id) - static_cast<unsigned>(p.local_offset));
}

// A token's routing read straight from the routing outputs.
struct GlobalRows {
  const FinalizeParams& p;
  size_t expanded;  // token * top_k
  __device__ int row(int k) const { return p.expanded_to_permuted[expanded + k]; }
  __device__ float weight(int k) const { return p.topk_weights[expanded + k]; }
  __device__ int expert(int k) const { return local_expert(p, p.topk_ids[expanded + k]); }
};

// The fold, called by every thread of a GEMM2 CTA at the end of the kernel,
// once the CTA's rows of y for its tile are written: columns [col_begin,
// col_end) (multiples of 8) of column block `block`, whose CTAs are the
// tiles' (num_tiles of them). The CTA that completes the block writes out
// for those columns of every token and resets the counter.
template <int kThreads>
__device__ __forceinline__ void fold_finalize(const FinalizeFold& fold, int block, int col_begin,
                                              int col_end, int num_tiles) {
  __shared__ int completes;
  __syncthreads();  // every thread's y stores issued
  if (threadIdx.x == 0) {
    __threadfence();  // ... and visible before the count (release)
    completes = atomicAdd(fold.counters + block, 1) == num_tiles - 1;
    if (completes) fold.counters[block] = 0;  // no other CTA of this call touches it now
    __threadfence();  // the other CTAs' y before this CTA's reads (acquire)
  }
  __syncthreads();
  if (!completes) return;
  const FinalizeParams& p = fold.finalize;
  const int vectors = (col_end - col_begin) / kVector;
  for (int i = threadIdx.x; i < p.num_tokens * vectors; i += kThreads) {
    const int token = i / vectors;
    const int col = col_begin + (i - token * vectors) * kVector;
    const GlobalRows rows{p, static_cast<size_t>(token) * p.top_k};
    *reinterpret_cast<uint4*>(p.out + static_cast<size_t>(token) * p.hidden + col) =
        token_columns<true>(p, rows, col);
  }
}

// A call with no tile on this rank: no GEMM2 CTA works, so CTA 0 writes the
// zeros the finalize would (every token's row of out). Every thread of CTA
// 0 calls it.
template <int kThreads>
__device__ __forceinline__ void fold_zeros(const FinalizeFold& fold) {
  const FinalizeParams& p = fold.finalize;
  const size_t vectors = static_cast<size_t>(p.num_tokens) * (p.hidden / kVector);
  for (size_t i = threadIdx.x; i < vectors; i += kThreads)
    reinterpret_cast<uint4*>(p.out)[i] = make_uint4(0, 0, 0, 0);
}

}  // namespace unimoe::finalize_device
