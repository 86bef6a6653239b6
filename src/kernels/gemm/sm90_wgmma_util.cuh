// What the wgmma kernels (sm90_wgmma_gemm.cu, sm90_fp8_wgmma_gemm.cu)
// share: the shared-memory descriptor of their 128-byte-swizzled K-major
// operands, the accumulator fence and the proxy fence between cp.async's
// writes and wgmma's reads. sm_90a only.
#pragma once

#include <cstdint>

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

namespace unimoe {

// Shared memory of a swizzled operand starts on a 128-byte swizzle atom (8
// rows of 128 bytes), so that the hardware's XOR of address bits [7, 10)
// into [4, 7) is the software layout of swizzled_offset (warp_mma.cuh).
inline constexpr int kSmemAlign = 1024;

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

}  // namespace unimoe
