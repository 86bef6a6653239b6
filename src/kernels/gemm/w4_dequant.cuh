// The W4A16 kernels' dequantization (stream_gemm_w4.cu, sm90_w4_wgmma_gemm.cu):
// 16 bytes of prepared e2m1 codes (32 K values of one weight row,
// core/fp4_layout.h) and their block scales become 16 bf16 pairs, the block
// scale applied with one exact bf16 multiply: an e2m1 value times a power of
// two (MXFP4), or times an e4m3 scale times 2^-9 (NVFP4, whose matrix scale
// times 2^9 then scales the fp32 sum). MXFP4 codes above 128 (scales of 2
// and more) take a second multiply, since 2^126 times their scale is not a
// bf16; code 255 (NaN) gives NaN.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "core/fp4_layout.h"
#include "kernels/gemm/stream_gemm_w4.cuh"

namespace unimoe::w4 {

inline constexpr uint32_t kNegZero2 = 0x80008000u;  // bf16x2 (-0, -0): a * b + -0 is a * b exactly

// 16 code bytes, not kept in L1 (each is read once per CTA); L2 fetches the
// whole 128-byte line.
__device__ __forceinline__ uint4 load_codes(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(kNegZero2));
  return d;
}

__device__ __forceinline__ uint32_t broadcast_bf16(uint32_t bits) { return bits | bits << 16; }

// The block scales of one lane load: MXFP4 one e8m0 code, NVFP4 two e4m3
// codes (low byte: values 0..15, high byte: 16..31).
__device__ __forceinline__ uint32_t load_scales(W4Format format, const uint8_t* p) {
  if (format == W4Format::MXFP4) return __ldg(p);
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}

// e4m3 code -> bf16 bits of its value times 2^117 (exact: at most 448 *
// 2^117 < 2^126, at least 2^-9 * 2^117).
__device__ __forceinline__ uint32_t nv_factor(uint32_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  const float f = __half2float(__half(h)) * 0x1p117f;
  return broadcast_bf16(__bfloat16_as_ushort(__float2bfloat16_rn(f)));
}

// 32 values of one row (a 16-byte load) -> 16 bf16 pairs d[m] = values (2m, 2m + 1).
__device__ __forceinline__ void dequantize(W4Format format, const uint4& w, uint32_t scales, uint32_t (&d)[16]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  if (format == W4Format::MXFP4) {
    const uint32_t f = broadcast_bf16((min(scales, 128u) + 126u) << 7);  // 2^(min(c, 128) - 1)
#pragma unroll
    for (int m = 0; m < 16; ++m) d[m] = bf16x2_mul(fp4_pair_bits(words[m / 4], m % 4), f);
    if (scales > 128u) {  // rare: scales of 2 and more, or NaN
      const uint32_t f2 = broadcast_bf16(scales == 255u ? 0x7FC0u : (scales - 1u) << 7);
#pragma unroll
      for (int m = 0; m < 16; ++m) d[m] = bf16x2_mul(d[m], f2);
    }
  } else {
    const uint32_t f0 = nv_factor(scales & 0xffu), f1 = nv_factor(scales >> 8);
#pragma unroll
    for (int m = 0; m < 16; ++m)
      d[m] = bf16x2_mul(fp4_pair_bits(words[m / 4], m % 4), m < 8 ? f0 : f1);
  }
}

}  // namespace unimoe::w4
