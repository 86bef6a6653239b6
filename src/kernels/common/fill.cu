#include "core/hash_random.h"
#include "kernels/common/common.cuh"
#include "kernels/common/fill.cuh"

namespace unimoe {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

__global__ void fill_bf16_kernel(uint16_t* out, std::size_t n, uint64_t seed, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[i] = fill_bf16_element(seed, i, scale);
}

__global__ void fill_f32_kernel(float* out, std::size_t n, uint64_t seed, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[i] = hash_uniform(seed, i) * scale;
}

__global__ void copy_kernel(uint4* dst, const uint4* src, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

int blocks_for(std::size_t n) {
  const std::size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < kMaxBlocks ? (b ? b : 1) : kMaxBlocks);
}

}  // namespace

void launch_fill_bf16(uint16_t* out, std::size_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (n == 0) return;
  fill_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, n, seed, scale);
  UNIMOE_LAUNCH_CHECK();
}

void launch_fill_f32(float* out, std::size_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (n == 0) return;
  fill_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, n, seed, scale);
  UNIMOE_LAUNCH_CHECK();
}

void launch_copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  const std::size_t n = bytes / sizeof(uint4);
  if (n == 0) return;
  copy_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<uint4*>(dst),
                                                       static_cast<const uint4*>(src), n);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
