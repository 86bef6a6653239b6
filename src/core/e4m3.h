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

#include "core/host_device.h"
#include "core/minifloat.h"

namespace unimoe {
namespace e4m3_detail {

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kF32Inf = 0x7f800000u;
constexpr uint32_t kF32Max448 = 0x43e00000u;  // 448.0f = 1.75 * 2^8
constexpr int kE4m3ManBits = 3;
constexpr int kE4m3Bias = 7;

}  // namespace e4m3_detail

UNIMOE_HD uint8_t encode_e4m3(float v) {
  using namespace e4m3_detail;
  const uint32_t u = minifloat::to_bits(v);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & kAbsMask;
  if (a > kF32Inf) return 0x7f;                                    // NaN, either sign
  if (a >= kF32Max448) return static_cast<uint8_t>(sign | 0x7eu);  // saturate, inf included
  // RNE onto e4m3's normals (a < 448 keeps the result at or below 0x7e)
  // and, below 2^-6, its multiples of 2^-9.
  return static_cast<uint8_t>(sign | minifloat::round_magnitude<kE4m3ManBits, kE4m3Bias>(a));
}

}  // namespace unimoe
