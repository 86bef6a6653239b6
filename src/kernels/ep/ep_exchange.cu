#include "kernels/ep/ep_exchange.cuh"

#include <cuda_bf16.h>

#include <stdexcept>
#include <string>

#include "kernels/common/common.cuh"

namespace unimoe {

namespace {

constexpr int kSlotThreads = 1024;  // tokens numbered a pass
constexpr int kSlotWarps = kSlotThreads / 32;
constexpr int kRowThreads = 128;
constexpr int kVector = 8;  // bf16 per 16-byte access

// The ranks holding one of token t's experts, a bit each.
__device__ __forceinline__ uint64_t rank_mask(const EPDispatchParams& p, int t) {
  uint64_t mask = 0;
  if (t >= p.num_tokens) return mask;
  for (int k = 0; k < p.top_k; ++k) {
    const int e = p.topk_ids[std::size_t(t) * p.top_k + k];
    if (e >= 0 && e < p.num_experts) mask |= 1ull << (e / p.experts_per_rank);
  }
  return mask;
}

// One CTA. Each pass numbers kSlotThreads tokens: per rank, a warp ballot
// gives each token's place in its warp, a scan over the warps (one thread a
// rank) each warp's base, and `base` carries the rank's count across passes.
__global__ void __launch_bounds__(kSlotThreads) ep_slots_kernel(EPDispatchParams p) {
  __shared__ int warp_base[kSlotWarps][kEPMaxWorldSize];
  __shared__ int base[kEPMaxWorldSize];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  if (tid < p.world_size) base[tid] = 0;
  __syncthreads();
  for (int first = 0; first < p.num_tokens; first += kSlotThreads) {
    const int t = first + tid;
    const uint64_t mask = rank_mask(p, t);
    for (int d = 0; d < p.world_size; ++d) {
      const unsigned votes = __ballot_sync(0xffffffffu, (mask >> d) & 1u);
      if (lane == 0) warp_base[warp][d] = __popc(votes);
    }
    __syncthreads();
    if (tid < p.world_size) {
      int run = base[tid];
      for (int w = 0; w < kSlotWarps; ++w) {
        const int c = warp_base[w][tid];
        warp_base[w][tid] = run;
        run += c;
      }
      base[tid] = run;
    }
    __syncthreads();
    for (int d = 0; d < p.world_size; ++d) {
      const bool sent = (mask >> d) & 1u;
      const unsigned votes = __ballot_sync(0xffffffffu, sent);
      if (t < p.num_tokens)
        p.slots[std::size_t(t) * p.world_size + d] =
            sent ? warp_base[warp][d] + __popc(votes & lanes_below) : -1;
    }
    __syncthreads();  // warp_base is rewritten by the next pass
  }
  if (tid < p.world_size) p.counts[tid] = base[tid];
}

// Copies each token's row, ids and weights into its slot of every chunk it
// goes to, then pads the chunks' unused rows (ids -1, weights 0; their x
// rows are never read).
__global__ void __launch_bounds__(kRowThreads) ep_pack_kernel(EPDispatchParams p) {
  const int vectors = p.hidden / kVector;
  for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const uint4* src = reinterpret_cast<const uint4*>(p.x + std::size_t(t) * p.hidden);
    for (int d = 0; d < p.world_size; ++d) {
      const int slot = p.slots[std::size_t(t) * p.world_size + d];
      if (slot < 0) continue;
      const std::size_t row = std::size_t(d) * p.max_tokens + slot;
      uint4* dst = reinterpret_cast<uint4*>(p.send_x + row * p.hidden);
      for (int v = threadIdx.x; v < vectors; v += blockDim.x) dst[v] = src[v];
      for (int k = threadIdx.x; k < p.top_k; k += blockDim.x) {
        p.send_ids[row * p.top_k + k] = p.topk_ids[std::size_t(t) * p.top_k + k];
        p.send_weights[row * p.top_k + k] = p.topk_weights[std::size_t(t) * p.top_k + k];
      }
    }
  }
  const std::size_t entries = std::size_t(p.world_size) * p.max_tokens * p.top_k;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < entries;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const int d = int(i / (std::size_t(p.max_tokens) * p.top_k));
    const int slot = int(i / p.top_k % p.max_tokens);
    if (slot < p.counts[d]) continue;
    p.send_ids[i] = -1;
    p.send_weights[i] = 0.0f;
  }
}

__global__ void __launch_bounds__(kRowThreads) ep_combine_kernel(EPCombineParams p) {
  __shared__ int slot_of[kEPMaxWorldSize];
  const int vectors = p.hidden / kVector;
  for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    __syncthreads();  // the previous token's slots are read
    if (threadIdx.x < p.world_size)
      slot_of[threadIdx.x] = p.slots[std::size_t(t) * p.world_size + threadIdx.x];
    __syncthreads();
    uint4* dst = reinterpret_cast<uint4*>(p.out + std::size_t(t) * p.hidden);
    for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
      // -0.0 is the identity of fp32 addition (0.0 would turn a -0.0 sum into
      // +0.0), so a token that reached one rank gets that rank's bits.
      float acc[kVector];
#pragma unroll
      for (int j = 0; j < kVector; ++j) acc[j] = -0.0f;
      for (int d = 0; d < p.world_size; ++d) {
        const int slot = slot_of[d];
        if (slot < 0) continue;
        const uint4 raw = reinterpret_cast<const uint4*>(
            p.partials + (std::size_t(d) * p.max_tokens + slot) * p.hidden)[v];
        const __nv_bfloat162* pair = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int j = 0; j < kVector / 2; ++j) {
          const float2 f = __bfloat1622float2(pair[j]);
          acc[2 * j] += f.x;
          acc[2 * j + 1] += f.y;
        }
      }
      uint4 packed;
      __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
      for (int j = 0; j < kVector / 2; ++j) out[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
      dst[v] = packed;
    }
  }
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("ep: " + what);
}

// Enough CTAs to fill the device a few times over; the kernels stride.
int row_grid(long long work) {
  const long long cap = 4LL * current_device_sm_count();
  return int(work < 1 ? 1 : (work < cap ? work : cap));
}

}  // namespace

void launch_ep_dispatch(const EPDispatchParams& p, cudaStream_t stream) {
  require(p.world_size >= 1 && p.world_size <= kEPMaxWorldSize, "world_size must be 1..64");
  require(p.num_experts >= p.world_size && p.experts_per_rank * p.world_size == p.num_experts,
          "num_experts must be experts_per_rank * world_size");
  require(p.num_tokens >= 0 && p.num_tokens <= p.max_tokens, "num_tokens must be 0..max_tokens");
  require(p.hidden > 0 && p.hidden % kVector == 0, "hidden must be a positive multiple of 8");
  require(p.top_k >= 1, "top_k must be >= 1");
  require(p.slots && p.counts && p.send_x && p.send_ids && p.send_weights, "outputs must be set");
  require(p.num_tokens == 0 || (p.x && p.topk_ids && p.topk_weights), "inputs must be set");
  ep_slots_kernel<<<1, kSlotThreads, 0, stream>>>(p);
  UNIMOE_LAUNCH_CHECK();
  const long long pad_ctas = (1LL * p.world_size * p.max_tokens * p.top_k + kRowThreads - 1) / kRowThreads;
  ep_pack_kernel<<<row_grid(p.num_tokens > pad_ctas ? p.num_tokens : pad_ctas), kRowThreads, 0, stream>>>(p);
  UNIMOE_LAUNCH_CHECK();
}

void launch_ep_combine(const EPCombineParams& p, cudaStream_t stream) {
  require(p.world_size >= 1 && p.world_size <= kEPMaxWorldSize, "world_size must be 1..64");
  require(p.num_tokens >= 0 && p.num_tokens <= p.max_tokens, "num_tokens must be 0..max_tokens");
  require(p.hidden > 0 && p.hidden % kVector == 0, "hidden must be a positive multiple of 8");
  if (p.num_tokens == 0) return;
  require(p.partials && p.slots && p.out, "buffers must be set");
  ep_combine_kernel<<<row_grid(p.num_tokens), kRowThreads, 0, stream>>>(p);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
