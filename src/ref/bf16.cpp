// bf16 <-> fp32, bit-exact: round to nearest, ties to even.
#include <cstring>

#include "ref/ref.h"

namespace unimoe::ref {

uint16_t f32_to_bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb;
  return static_cast<uint16_t>(bits >> 16);
}

float bf16_to_f32(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float v;
  std::memcpy(&v, &wide, 4);
  return v;
}

float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

}  // namespace unimoe::ref
