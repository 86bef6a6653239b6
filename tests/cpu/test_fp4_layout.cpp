// The prepared nibble order of 4-bit weights (core/fp4_layout.h):
// fp4_unprepare_word undoes fp4_prepare_word; every pair of every nibble
// pair reads back, as two bf16 times 2^126, the reference's e2m1 values;
// and one word worked by hand matches the picture in the header.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/fp4_layout.h"
#include "core/hash_random.h"
#include "ref/ref.h"

namespace unimoe {
namespace {

// The bf16 in half h (0 low, 1 high) of a bf16x2, as fp32.
float bf16_half(uint32_t pair, int h) {
  const uint32_t bits = (h == 0 ? pair & 0xffffu : pair >> 16) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

TEST(Fp4Layout, UnprepareUndoesPrepare) {
  for (const uint32_t w : {0x00000000u, 0xffffffffu, 0x88888888u, 0x77777777u, 0x01234567u,
                           0xfedcba98u, 0x0000000fu, 0xf0000000u, 0x80000000u, 0x00000001u})
    EXPECT_EQ(fp4_unprepare_word(fp4_prepare_word(w)), w) << std::hex << w;
  for (uint64_t i = 0; i < 200000; ++i) {
    const uint32_t w = static_cast<uint32_t>(hash64(i ^ 0xf4));
    ASSERT_EQ(fp4_unprepare_word(fp4_prepare_word(w)), w) << std::hex << w;
  }
  // Each of the 32 bits of a checkpoint word lands on its own prepared bit.
  uint32_t seen = 0;
  for (int b = 0; b < 32; ++b) {
    const uint32_t p = fp4_prepare_word(1u << b);
    ASSERT_EQ(p & (p - 1), 0u) << "bit " << b << " gives " << std::hex << p;
    ASSERT_EQ(seen & p, 0u) << "bit " << b;
    seen |= p;
  }
  EXPECT_EQ(seen, 0xffffffffu);
}

// For every pair v and every two nibbles (a, b) placed as values 2v and
// 2v + 1 of a word whose other nibbles are random: the pair's bf16 halves
// times 2^126 are e2m1(a) and e2m1(b), exactly.
TEST(Fp4Layout, PairBitsAreTheE2m1ValuesScaled) {
  const float k2Pow126 = std::ldexp(1.0f, 126);
  for (int v = 0; v < 4; ++v)
    for (uint32_t a = 0; a < 16; ++a)
      for (uint32_t b = 0; b < 16; ++b) {
        const uint32_t noise = static_cast<uint32_t>(hash64(v * 256 + a * 16 + b));
        const uint32_t mask = 0xffu << (8 * v);
        const uint32_t word = (noise & ~mask) | ((a | b << 4) << (8 * v));
        const uint32_t pair = fp4_pair_bits(fp4_prepare_word(word), v);
        SCOPED_TRACE("pair " + std::to_string(v) + " nibbles " + std::to_string(a) + ", " +
                     std::to_string(b));
        const float lo = bf16_half(pair, 0) * k2Pow126, hi = bf16_half(pair, 1) * k2Pow126;
        const float want_lo = ref::e2m1_to_f32(static_cast<uint8_t>(a));
        const float want_hi = ref::e2m1_to_f32(static_cast<uint8_t>(b));
        EXPECT_EQ(lo, want_lo);
        EXPECT_EQ(hi, want_hi);
        EXPECT_EQ(std::signbit(lo), std::signbit(want_lo));  // -0 stays -0
        EXPECT_EQ(std::signbit(hi), std::signbit(want_hi));
      }
}

// The picture of core/fp4_layout.h, one word by hand. Value j = 0..7 has
// magnitude (j + 1) % 8 and is negative for odd j: nibbles 1, a, 3, c, 5,
// e, 7, 8, so the checkpoint word (value j in bits 4j..4j+3) is 0x87e5c3a1.
// Low half (even j): magnitudes 1, 3, 5, 7 in bits 2-0, 5-3, 8-6, 11-9 =
//   0b111'101'011'001 = 0xf59, signs 0: 0x0f59.
// High half (odd j): magnitudes 2, 4, 6, 0 = 0b000'110'100'010 = 0x1a2,
//   the four signs 1 in bits 12-15: 0xf1a2.
TEST(Fp4Layout, TheDocumentedPicture) {
  const uint32_t checkpoint = 0x87e5c3a1u;
  const uint32_t prepared = 0xf1a20f59u;
  EXPECT_EQ(fp4_prepare_word(checkpoint), prepared);
  EXPECT_EQ(fp4_unprepare_word(prepared), checkpoint);
}

}  // namespace
}  // namespace unimoe
