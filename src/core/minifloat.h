// What the fp32 -> e4m3 (core/e4m3.h) and fp32 -> e2m1 (core/e2m1.h)
// encoders share, the same code on host and device: fp32 bits of a float,
// and the round-to-nearest-even of a magnitude onto a narrow float format
// of kManBits mantissa bits and exponent bias kBias (no infinities; the
// caller saturates at the format's largest value first).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace unimoe::minifloat {

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ uint32_t to_bits(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float from_bits(uint32_t u) { return __uint_as_float(u); }
#else
inline uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
#endif

constexpr int kF32ManBits = 23;

// The code (exponent | mantissa, no sign) of the fp32 magnitude whose bits
// are `a` (sign cleared, a finite value below the format's saturation
// point), RNE. Normals drop 23 - kManBits mantissa bits with RNE on the
// exponent|mantissa integer (a mantissa that rounds up carries into the
// exponent). Below the smallest normal 2^(1 - kBias) the codes are the
// multiples of q = 2^(1 - kBias - kManBits), code = RNE(a / q): for an
// fp32 normal a = sig * 2^(exp - 150), so a / q = sig >> (151 - kBias -
// kManBits - exp) (141 - exp for e4m3, 149 - exp for e2m1); fp32
// subnormals and shifts past 25 (a / q < 1/4) give 0.
template <int kManBits, int kBias>
UNIMOE_HD uint32_t round_magnitude(uint32_t a) {
  constexpr int kDropBits = kF32ManBits - kManBits;
  constexpr uint32_t kRebias = static_cast<uint32_t>(127 - kBias) << kManBits;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(127 + 1 - kBias) << kF32ManBits;
  if (a >= kMinNormal) {
    const uint32_t rounded = a + ((1u << (kDropBits - 1)) - 1u) + ((a >> kDropBits) & 1u);
    return (rounded >> kDropBits) - kRebias;
  }
  constexpr uint32_t kShiftBase = 150u - static_cast<uint32_t>(kBias - 1 + kManBits);
  const uint32_t exp = a >> kF32ManBits;
  const uint32_t shift = kShiftBase - exp;
  if (exp == 0 || shift > 25) return 0;
  const uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  const uint32_t q = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

}  // namespace unimoe::minifloat
