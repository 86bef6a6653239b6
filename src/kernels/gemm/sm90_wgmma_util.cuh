// What the wgmma kernels (sm90_wgmma_gemm.cu, sm90_fp8_wgmma_gemm.cu)
// share: the shared-memory descriptor of their 128-byte-swizzled K-major
// operands, the accumulator fence and the proxy fence between cp.async's
// writes and wgmma's reads. sm_90a only.
#pragma once

#include <cstdint>

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include "kernels/gemm/warp_mma.cuh"

namespace unimoe {

// Shared memory of a swizzled operand starts on a 128-byte swizzle atom (8
// rows of 128 bytes), so that the hardware's XOR of address bits [7, 10)
// into [4, 7) is the software layout of swizzled_offset (warp_mma.cuh).
inline constexpr int kSmemAlign = 1024;

// The first swizzle atom in the dynamic shared memory at `raw` (which
// has kSmemAlign bytes to spare): its shared address; *aligned points at it.
__device__ __forceinline__ uint32_t align_to_swizzle_atom(uint8_t* raw, uint8_t** aligned) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  const uint32_t base = (address + kSmemAlign - 1) & ~static_cast<uint32_t>(kSmemAlign - 1);
  *aligned = raw + (base - address);
  return base;
}

// wgmma's shared-memory descriptor of a K-major operand in 128-byte
// swizzled rows: 8-row atoms 1024 bytes apart; the leading offset is unused
// by swizzled K-major layouts (1 by convention).
__device__ __forceinline__ uint64_t sw128_descriptor(uint32_t address) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>((address & 0x3FFFF) >> 4);
  d.bitfield.leading_byte_offset_ = 1;
  d.bitfield.stride_byte_offset_ = 1024 >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = static_cast<uint8_t>(cute::SM90::GMMA::LayoutType::B128);
  return d.desc_;
}

template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(d[i]);
}

__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The wgmma kernels' cp.async pipeline: kStages slots of kStageBytes from
// `base`, filled by `loader` (TileOperandLoader). Loads run kStages - 2 K
// blocks ahead of the MMAs and one wgmma batch stays in flight while the
// next is issued, so a slot is refilled only after the barrier that
// follows every thread's wait for the batch that last read it.
template <int kStages, int kStageBytes, class Loader, class Args>
struct WgmmaPipeline {
  static_assert(kStages >= 3, "loads run kStages - 2 blocks ahead of the MMA");
  static_assert(kStageBytes % kSmemAlign == 0, "every slot starts on a swizzle atom");
  const Loader& loader;
  const Args& args;
  uint32_t base;
  int k_tiles;

  __device__ __forceinline__ void prologue() const {
#pragma unroll
    for (int s = 0; s < kStages - 2; ++s) {
      if (s < k_tiles) loader.load(args, base + s * kStageBytes, s);
      cp_async_commit();
    }
  }

  // Block k_tile's slot, once this thread's copies of it have landed, are
  // visible to wgmma (the async proxy) and every thread has passed the same
  // point: then every thread's MMAs of block k_tile - 2 are done, and its
  // slot takes block k_tile + kStages - 2. Call once per block, in order,
  // with a wait for all but the last wgmma batch after each block's MMAs.
  __device__ __forceinline__ uint32_t acquire(int k_tile) const {
    cp_async_wait<kStages - 3>();
    fence_proxy_async_shared();
    __syncthreads();
    const int next = k_tile + kStages - 2;
    if (next < k_tiles) loader.load(args, base + (next % kStages) * kStageBytes, next);
    cp_async_commit();
    return base + (k_tile % kStages) * kStageBytes;
  }
};

}  // namespace unimoe
