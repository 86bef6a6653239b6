// fp32 -> e2m1 and the block-scale rules of MXFP4 and NVFP4, the same code
// on host and device: the rules of ref::quantize (docs/quantization.md,
// "MXFP4" and "NVFP4") that the 4-bit weight quantize kernels apply
// (kernels/quant/fp4_weights.cuh).
//
// encode_e2m1 is ref::f32_to_e2m1 in integer arithmetic on the fp32 bits:
// RNE; |v| >= 6 (inf included) saturates to 6; NaN gives 6 with the input's
// sign bit; the sign bit is always copied (-0 and negatives that round to
// zero give 0x8). The scale rules use IEEE fp32 operations in the
// reference's order (__fdiv_rn and __fmul_rn on the device, so no
// contraction or approximate division can creep in).
//
// Checked against the reference on the CPU: every e2m1 tie and its
// neighbours, a sweep over the fp32 bit patterns, every e4m3 code, and
// whole matrices quantized with these rules against ref::quantize
// (tests/cpu/test_e2m1_encode.cpp).
#pragma once

#include <cstdint>

#include "core/e4m3.h"
#include "core/host_device.h"
#include "core/minifloat.h"

namespace unimoe {
namespace e2m1_detail {

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
#else
inline float div_rn(float a, float b) { return a / b; }
inline float mul_rn(float a, float b) { return a * b; }
#endif
using minifloat::from_bits;
using minifloat::to_bits;

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kF32Inf = 0x7f800000u;
constexpr uint32_t kF32Six = 0x40c00000u;  // 6.0f = 1.5 * 2^2, e2m1's largest value
constexpr int kF32ManBits = minifloat::kF32ManBits;
constexpr int kE2m1ManBits = 1;
constexpr int kE2m1Bias = 1;
constexpr uint32_t kE2m1Max = 0x7u;
constexpr uint32_t kE2m1Sign = 0x8u;

constexpr int kF32Bias = 127;
constexpr int kE2m1MaxExp = 2;  // 6 = 1.5 * 2^2
constexpr uint8_t kE8m0MaxFinite = 254;
constexpr float kE2m1MaxValue = 6.0f;
constexpr float kNvfp4GlobalDivisor = 448.0f * 6.0f;  // 2688: e4m3's largest times e2m1's

}  // namespace e2m1_detail

// The e2m1 nibble (s ee m) of v.
UNIMOE_HD uint8_t encode_e2m1(float v) {
  using namespace e2m1_detail;
  const uint32_t u = to_bits(v);
  const uint32_t sign = (u >> 28) & kE2m1Sign;
  const uint32_t a = u & kAbsMask;
  if (a >= kF32Six) return static_cast<uint8_t>(sign | kE2m1Max);  // saturate; inf and NaN too
  // RNE onto e2m1's normals (a < 6 keeps the result at or below 6, code
  // 7) and, below 1, its multiples of 0.5.
  return static_cast<uint8_t>(sign | minifloat::round_magnitude<kE2m1ManBits, kE2m1Bias>(a));
}

// ---- MXFP4 -----------------------------------------------------------------

// The e8m0 code of a block whose largest magnitude is amax (>= 0, not NaN):
// floor(log2(amax)) - 2 + 127 clamped to [0, 254]; 0 for amax 0. For an
// fp32 normal floor(log2) is its exponent field minus 127, so the code is
// the field minus 2, at least 0; subnormals give 0 and inf 254.
UNIMOE_HD uint8_t mx_scale_code(float amax) {
  using namespace e2m1_detail;
  const uint32_t a = to_bits(amax) & kAbsMask;
  if (a >= kF32Inf) return kE8m0MaxFinite;
  const int field = static_cast<int>(a >> kF32ManBits);
  const int code = field - kE2m1MaxExp;
  return static_cast<uint8_t>(field == 0 || code < 0 ? 0 : code);
}

// The element of x in a block of scale code `code`: e2m1(x * 2^-(code -
// 127)), the scaling one correctly rounded multiplication by a power of two
// (the reference's ldexp). The sign is x's, which a product keeps, NaN
// included (the device's multiplication returns a NaN without the sign).
UNIMOE_HD uint8_t mx_encode(float x, uint8_t code) {
  using namespace e2m1_detail;
  // 2^(127 - code), code in [0, 254]: exponent field 254 - code, or the
  // fp32 subnormal 2^-127 for code 254.
  const int field = 2 * kF32Bias - code;
  const float factor = from_bits(field > 0 ? static_cast<uint32_t>(field) << kF32ManBits : 1u << 22);
  const uint32_t sign = (to_bits(x) >> 28) & kE2m1Sign;
  return static_cast<uint8_t>(sign | (encode_e2m1(mul_rn(x, factor)) & kE2m1Max));
}

// ---- NVFP4 -----------------------------------------------------------------

// The matrix scale: amax / 2688 (448 * 6), 1 when that is not > 0.
UNIMOE_HD float nvfp4_global_scale(float amax) {
  using namespace e2m1_detail;
  const float global = div_rn(amax, kNvfp4GlobalDivisor);
  return global > 0.0f ? global : 1.0f;
}

// The e4m3 value of a block scale code, ref::e4m3_to_f32 (0x7f and 0xff NaN).
UNIMOE_HD float nvfp4_block_scale_value(uint8_t code) {
  using namespace e2m1_detail;
  const uint32_t magnitude = code & 0x7fu;
  if (magnitude == 0x7fu) return from_bits(0x7fc00000u);
  const uint32_t exp = magnitude >> 3, man = magnitude & 0x7u;
  // Subnormals man * 2^-9 (exact in fp32); normals 1.man * 2^(exp - 7).
  const float value = exp == 0 ? static_cast<float>(man) * 0.001953125f
                               : from_bits(((exp + 120u) << kF32ManBits) | (man << 20));
  return from_bits(to_bits(value) | (static_cast<uint32_t>(code & 0x80u) << 24));
}

// The e4m3 block scale code: e4m3((amax_block / 6) / global).
UNIMOE_HD uint8_t nvfp4_block_code(float amax_block, float global) {
  using namespace e2m1_detail;
  return encode_e4m3(div_rn(div_rn(amax_block, kE2m1MaxValue), global));
}

// The divisor of a block's elements: e4m3 value of the code times global.
UNIMOE_HD float nvfp4_divisor(uint8_t code, float global) {
  return e2m1_detail::mul_rn(nvfp4_block_scale_value(code), global);
}

// The element of x in a block of divisor d: e2m1(x / d), or +0 when d is
// not > 0 (a block scale that rounded to 0, or NaN). The sign is x's, which
// a quotient by d > 0 keeps, NaN included.
UNIMOE_HD uint8_t nv_encode(float x, float divisor) {
  using namespace e2m1_detail;
  if (!(divisor > 0.0f)) return 0;
  const uint32_t sign = (to_bits(x) >> 28) & kE2m1Sign;
  return static_cast<uint8_t>(sign | (encode_e2m1(div_rn(x, divisor)) & kE2m1Max));
}

}  // namespace unimoe
