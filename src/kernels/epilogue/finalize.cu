// The deterministic finalize (contract: grouped_gemm.cuh):
//   out[t, :] = sum over k = 0..K-1, in that order, of topk_weights[t, k] * y[row(t, k), :]
// with row(t, k) = expanded_to_permuted[t * K + k] and rows of -1 (off rank)
// skipped; fp32 accumulation, one bf16 rounding at the store. A token with no
// on-rank row gets zeros. No atomics, so the result is the same bits on
// every run.
#include <cuda_bf16.h>

#include <stdexcept>
#include <string>

#include "kernels/common/common.cuh"
#include "kernels/gemm/grouped_gemm.cuh"

namespace unimoe {
namespace {

constexpr int kFinalizeThreads = 128;
constexpr int kMaxTopK = 32;  // the limit on K (src/core/validate.cpp)
constexpr int kVector = 8;    // bf16 per 16-byte load
constexpr int kBatch = 8;     // rows of a token loaded together
static_assert(kMaxTopK <= kFinalizeThreads, "one thread reads each k's row and weight");

// Block (t, column block): each thread owns kVector consecutive columns.
__global__ void __launch_bounds__(kFinalizeThreads) finalize_kernel(const FinalizeParams p) {
  if (!p.routing_ready_before_wait) pdl_begin();
  __shared__ int rows[kMaxTopK];
  __shared__ float weights[kMaxTopK];
  __shared__ int experts[kMaxTopK];
  const int token = blockIdx.x;
  const size_t expanded = static_cast<size_t>(token) * p.top_k;
  if (threadIdx.x < p.top_k) {
    rows[threadIdx.x] = p.expanded_to_permuted[expanded + threadIdx.x];
    weights[threadIdx.x] = p.topk_weights[expanded + threadIdx.x];
    // Read only where rows[k] >= 0, i.e. the permute found the id local; the
    // unsigned difference keeps any other id (INT_MIN, say) from overflowing.
    experts[threadIdx.x] =
        p.b2 ? static_cast<int>(static_cast<unsigned>(p.topk_ids[expanded + threadIdx.x]) -
                                static_cast<unsigned>(p.local_offset))
             : 0;
  }
  __syncthreads();
  pdl_begin();  // y is the previous kernel's output
  if (p.enabled != nullptr && *p.enabled == 0) return;  // the gate chose the combine path

  const int col = (blockIdx.y * kFinalizeThreads + threadIdx.x) * kVector;
  if (col >= p.hidden) return;
  // A token's rows are read kBatch at a time, every load issued before the
  // first add, so a thread has up to kBatch loads in flight instead of one;
  // the adds keep k order, so the bits do not change.
  float acc[kVector] = {};
  for (int k0 = 0; k0 < p.top_k; k0 += kBatch) {
    uint4 raw[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int row = k0 + j < p.top_k ? rows[k0 + j] : -1;
      raw[j] = row >= 0 ? *reinterpret_cast<const uint4*>(p.y + static_cast<size_t>(row) * p.hidden + col)
                        : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int k = k0 + j;
      if (k >= p.top_k || rows[k] < 0) continue;
      const float w = weights[k];
      const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(&raw[j]);
#pragma unroll
      for (int i = 0; i < kVector / 2; ++i) {
        const float2 f = __bfloat1622float2(v[i]);
        acc[2 * i] = fmaf(w, f.x, acc[2 * i]);
        acc[2 * i + 1] = fmaf(w, f.y, acc[2 * i + 1]);
      }
      if (p.b2) {
        const float* bias = p.b2 + static_cast<size_t>(experts[k]) * p.hidden + col;
#pragma unroll
        for (int i = 0; i < kVector; ++i) acc[i] = fmaf(w, bias[i], acc[i]);
      }
    }
  }
  uint4 packed;
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < kVector / 2; ++i) out[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  *reinterpret_cast<uint4*>(p.out + static_cast<size_t>(token) * p.hidden + col) = packed;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::runtime_error("launch_finalize: " + message);
}

}  // namespace

void launch_finalize(const FinalizeParams& p, KernelStream stream) {
  require(p.num_tokens >= 0, "num_tokens is " + std::to_string(p.num_tokens) + "; must be >= 0");
  require(p.top_k > 0 && p.top_k <= kMaxTopK,
          "top_k is " + std::to_string(p.top_k) + "; allowed 1.." + std::to_string(kMaxTopK));
  require(p.hidden > 0 && p.hidden % kVector == 0,
          "hidden is " + std::to_string(p.hidden) + "; must be a positive multiple of 8");
  if (p.num_tokens == 0) return;
  require(p.y != nullptr && p.expanded_to_permuted != nullptr && p.topk_weights != nullptr &&
              p.out != nullptr,
          "y, expanded_to_permuted, topk_weights or out is null");
  require(p.b2 == nullptr || p.topk_ids != nullptr, "b2 needs topk_ids");
  const dim3 grid(p.num_tokens, ceil_div(p.hidden / kVector, kFinalizeThreads));
  launch_pdl(finalize_kernel, grid, kFinalizeThreads, 0, stream, p);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
