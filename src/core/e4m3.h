// fp32 -> e4m3 "fn" in integer arithmetic on the fp32 bits, the same code on
// host and device: the rule of ref::f32_to_e4m3 (docs/quantization.md) that
// the fp8 quantize kernels apply. RNE; |v| >= 448 (inf included) saturates
// to +-448; NaN of either sign gives 0x7f; the sign bit is always copied, so
// -0 and negatives that round to zero give 0x80.
//
// Checked against the reference on the CPU for every tie and its neighbours
// and a sweep over the fp32 bit patterns (tests/cpu/test_e4m3_encode.cpp).
// The hardware conversion (cvt.rn.satfinite.e4m3x2.f32) is not used: PTX
// specifies only that NaN gives a NaN (not which code for -NaN), and this
// form can be checked bit for bit without a GPU (all 2^32 inputs agree).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace unimoe {
namespace e4m3_detail {

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ uint32_t to_bits(float f) { return __float_as_uint(f); }
#else
inline uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
#endif

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kF32Inf = 0x7f800000u;
constexpr uint32_t kF32Max448 = 0x43e00000u;        // 448.0f = 1.75 * 2^8
constexpr uint32_t kF32MinNormalE4m3 = 0x3c800000u;  // 2^-6, e4m3's smallest normal
constexpr int kF32ManBits = 23;
constexpr int kE4m3ManBits = 3;
constexpr int kDropBits = kF32ManBits - kE4m3ManBits;  // 20
constexpr uint32_t kRebias = (127u - 7u) << kE4m3ManBits;  // fp32 bias 127, e4m3 bias 7

}  // namespace e4m3_detail

UNIMOE_HD uint8_t encode_e4m3(float v) {
  using namespace e4m3_detail;
  const uint32_t u = to_bits(v);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & kAbsMask;
  if (a > kF32Inf) return 0x7f;                             // NaN, either sign
  if (a >= kF32Max448) return static_cast<uint8_t>(sign | 0x7eu);  // saturate, inf included
  uint32_t code;
  if (a >= kF32MinNormalE4m3) {
    // Normal: drop 20 mantissa bits with RNE on the exponent|mantissa
    // integer; a mantissa that rounds up carries into the exponent. a < 448
    // keeps the result at or below 0x7e.
    const uint32_t rounded = a + ((1u << (kDropBits - 1)) - 1u) + ((a >> kDropBits) & 1u);
    code = (rounded >> kDropBits) - kRebias;
  } else {
    // Below 2^-6: the multiples of 2^-9, code = RNE(a * 2^9) in 0..8 (8 is
    // the smallest normal, 0x08). a = sig * 2^(exp - 150) for an fp32 normal,
    // so a * 2^9 = sig >> (141 - exp); fp32 subnormals (exp 0) are below
    // 2^-126 and give 0, as does any shift past 25 (a * 2^9 < 1/4).
    const uint32_t exp = a >> kF32ManBits;
    const uint32_t shift = 141u - exp;  // >= 21 here, since exp <= 120
    if (exp == 0 || shift > 25) {
      code = 0;
    } else {
      const uint32_t sig = (a & 0x7fffffu) | 0x800000u;
      const uint32_t q = sig >> shift;
      const uint32_t rem = sig & ((1u << shift) - 1u);
      const uint32_t half = 1u << (shift - 1);
      code = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    }
  }
  return static_cast<uint8_t>(sign | code);
}

}  // namespace unimoe
