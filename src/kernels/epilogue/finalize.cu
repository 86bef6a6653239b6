// The deterministic finalize (contract: grouped_gemm.cuh):
//   out[t, :] = sum over k = 0..K-1, in that order, of topk_weights[t, k] * y[row(t, k), :]
// with row(t, k) = expanded_to_permuted[t * K + k] and rows of -1 (off rank)
// skipped; fp32 accumulation, one bf16 rounding at the store (the steps:
// finalize_device.cuh, which the GEMM2 kernels that fold the finalize
// share). A token with no on-rank row gets zeros. No atomics, so the result
// is the same bits on every run.
#include <cuda_bf16.h>

#include <stdexcept>
#include <string>

#include "kernels/common/common.cuh"
#include "kernels/epilogue/finalize_device.cuh"
#include "kernels/gemm/grouped_gemm.cuh"

namespace unimoe {
namespace {

using finalize_device::kVector;
constexpr int kFinalizeThreads = 128;
constexpr int kMaxTopK = 32;  // the limit on K (src/core/validate.cpp)
static_assert(kMaxTopK <= kFinalizeThreads, "one thread reads each k's row and weight");

// A token's routing, staged in shared memory by the block.
struct SharedRows {
  const int* rows;
  const float* weights;
  const int* experts;
  __device__ int row(int k) const { return rows[k]; }
  __device__ float weight(int k) const { return weights[k]; }
  __device__ int expert(int k) const { return experts[k]; }
};

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
    // Read only where rows[k] >= 0, i.e. the permute found the id local.
    experts[threadIdx.x] =
        p.b2 ? finalize_device::local_expert(p, p.topk_ids[expanded + threadIdx.x]) : 0;
  }
  __syncthreads();
  pdl_begin();  // y is the previous kernel's output
  if (p.enabled != nullptr && *p.enabled == 0) return;  // the gate chose the combine path

  const int col = (blockIdx.y * kFinalizeThreads + threadIdx.x) * kVector;
  if (col >= p.hidden) return;
  const SharedRows token_rows{rows, weights, experts};
  *reinterpret_cast<uint4*>(p.out + static_cast<size_t>(token) * p.hidden + col) =
      finalize_device::token_columns<false>(p, token_rows, col);
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::runtime_error("launch_finalize: " + message);
}

}  // namespace

bool finalize_fold_valid(const FinalizeFold& fold, const uint16_t* y, int n_out) {
  const FinalizeParams& p = fold.finalize;
  return p.y == y && p.hidden == n_out && n_out % kVector == 0 && p.top_k >= 1 &&
         p.top_k <= kMaxTopK && p.num_tokens >= 1 && p.expanded_to_permuted != nullptr &&
         p.topk_weights != nullptr && p.out != nullptr && (p.b2 == nullptr || p.topk_ids != nullptr);
}

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
