// The number formats of the quantization emulation (bf16, e4m3, e2m1, e8m0):
// hand-computed bit patterns, every code round-tripped, and random values
// checked against a brute-force oracle (the nearest representable value, ties
// to the even code) that shares nothing with the encoder's binade arithmetic.
// The scaled matrices are tested in test_quant_matrix.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "ref/ref.h"

namespace unimoe::ref {
namespace {

float from_bits(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

uint32_t bits_of(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits;
}

// Random sign, binade 2^exp for exp in [min_exp, max_exp] (normal fp32
// binades: -126..127), all 23 mantissa bits random.
float random_float(std::mt19937_64& rng, int min_exp, int max_exp) {
  const int exp = std::uniform_int_distribution<int>(min_exp, max_exp)(rng);
  const uint32_t bits = (static_cast<uint32_t>(rng() & 1) << 31) |
                        (static_cast<uint32_t>(exp + 127) << 23) | (rng() & 0x7fffffu);
  return from_bits(bits);
}

// The oracle: the code in [0, max_code] whose decoded value is nearest to
// a >= 0, ties to the even code; beyond the largest value that is the largest.
uint8_t nearest_code(float a, float (*decode)(uint8_t), uint8_t max_code) {
  uint8_t best = 0;
  double best_dist = INFINITY;
  for (int code = 0; code <= max_code; ++code) {
    const double dist = std::fabs(static_cast<double>(decode(static_cast<uint8_t>(code))) - a);
    if (dist < best_dist || (dist == best_dist && code % 2 == 0)) {
      best = static_cast<uint8_t>(code);
      best_dist = dist;
    }
  }
  return best;
}

uint8_t e4m3_oracle(float v) {
  return static_cast<uint8_t>((std::signbit(v) ? 0x80 : 0) |
                              nearest_code(std::fabs(v), e4m3_to_f32, 0x7e));
}

uint8_t e2m1_oracle(float v) {
  return static_cast<uint8_t>((std::signbit(v) ? 0x8 : 0) |
                              nearest_code(std::fabs(v), e2m1_to_f32, 0x7));
}

// ------------------------------------------------------------------ bf16 ----

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie, 0x3f80 even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, 0x3f81 odd: up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);  // just above the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f817fffu)), 0x3f81);  // just below the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0xbf818000u)), 0xbf82);  // sign does not matter
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(bf16_to_f32(0x3fc0), 1.5f);
  EXPECT_EQ(round_bf16(from_bits(0x3f818000u)), from_bits(0x3f820000u));
}

TEST(Bf16, KeepsNanAndInfinity) {
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fffffffu}) {
    const uint16_t b = f32_to_bf16(from_bits(nan));
    EXPECT_TRUE(std::isnan(bf16_to_f32(b))) << std::hex << nan;
    EXPECT_EQ(b & 0x8000, (nan >> 16) & 0x8000) << "sign of " << std::hex << nan;
    EXPECT_TRUE(b & 0x0040) << "quiet bit of " << std::hex << nan;
  }
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
}

TEST(Bf16, OverflowsToInfinity) {
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);  // FLT_MAX rounds up
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f8000u)), 0x7f80);  // tie at the top, 0x7f7f odd
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(from_bits(0xff7fffffu)), 0xff80);
}

TEST(Bf16, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float v = bf16_to_f32(static_cast<uint16_t>(b));
    EXPECT_EQ(bits_of(v), b << 16);
    if (!std::isnan(v)) {
      EXPECT_EQ(f32_to_bf16(v), b);
    }
  }
}

// The two bf16 neighbours of v, the nearer chosen in fp64, ties to even.
TEST(Bf16, MatchesNearestNeighbour) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int n = 0; n < 20000; ++n) {
    const float v = random_float(rng, -126, 120);
    const uint32_t lo = bits_of(v) >> 16;
    const double below = bf16_to_f32(static_cast<uint16_t>(lo));
    const double above = bf16_to_f32(static_cast<uint16_t>(lo + 1));
    const double d_below = std::fabs(v - below), d_above = std::fabs(above - v);
    const uint32_t want = (d_below < d_above || (d_below == d_above && lo % 2 == 0)) ? lo : lo + 1;
    ASSERT_EQ(f32_to_bf16(v), want) << std::hex << bits_of(v);
  }
}

// ------------------------------------------------------------------ e4m3 ----

TEST(E4m3, DecodesKnownCodes) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x07), std::ldexp(7.0f, -9));  // largest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);                  // exponent field 7 = bias
  EXPECT_EQ(e4m3_to_f32(0x3c), 1.5f);
  EXPECT_EQ(e4m3_to_f32(0x7d), 416.0f);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
  EXPECT_EQ(e4m3_to_f32(0x80), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)));
}

TEST(E4m3, EncodesKnownValues) {
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_e4m3(-2.0f), 0xc0);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -6)), 0x08);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -12)), 0x00);   // far below the smallest subnormal
  EXPECT_EQ(f32_to_e4m3(-std::ldexp(1.0f, -12)), 0x80);  // keeps its sign
  EXPECT_EQ(f32_to_e4m3(from_bits(1)), 0x00);            // fp32 subnormal input
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(449.0f), 0x7e);  // saturates
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(480.0f), 0x7e);  // would be 0x7f (NaN) without saturation
  EXPECT_EQ(f32_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_e4m3(NAN), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-NAN), 0x7f);
}

TEST(E4m3, RoundsTiesToEven) {
  const float sub = std::ldexp(1.0f, -9);                          // the subnormal step
  EXPECT_EQ(f32_to_e4m3(0.5f * sub), 0x00);                        // 0 or 0x01: 0 is even
  EXPECT_EQ(f32_to_e4m3(std::nextafter(0.5f * sub, 1.0f)), 0x01);  // just above: up
  EXPECT_EQ(f32_to_e4m3(1.5f * sub), 0x02);                        // 0x01 or 0x02
  EXPECT_EQ(f32_to_e4m3(2.5f * sub), 0x02);                        // 0x02 or 0x03
  EXPECT_EQ(f32_to_e4m3(7.5f * sub), 0x08);                        // subnormal/normal edge
  EXPECT_EQ(f32_to_e4m3(std::nextafter(7.5f * sub, 0.0f)), 0x07);  // just below: down
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);                           // 1 or 1.125
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);                           // 1.125 or 1.25
  EXPECT_EQ(f32_to_e4m3(1.9375f), 0x40);                           // 1.875 or 2: carries
  EXPECT_EQ(f32_to_e4m3(-1.9375f), 0xc0);
  EXPECT_EQ(f32_to_e4m3(400.0f), 0x7c);  // 384 or 416
  EXPECT_EQ(f32_to_e4m3(432.0f), 0x7e);  // 416 or 448
  EXPECT_EQ(f32_to_e4m3(std::nextafter(432.0f, 0.0f)), 0x7d);
}

// Decode then encode gives the code back, -0 (0x80) included; both NaN codes
// come back as the one NaN the encoder emits, 0x7f.
TEST(E4m3, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const uint8_t want = (code & 0x7f) == 0x7f ? 0x7f : static_cast<uint8_t>(code);
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(code))), want) << code;
  }
  for (int code = 1; code <= 0x7e; ++code) {  // monotonic, and negatives mirror
    EXPECT_LT(e4m3_to_f32(static_cast<uint8_t>(code - 1)), e4m3_to_f32(static_cast<uint8_t>(code)));
    EXPECT_EQ(e4m3_to_f32(static_cast<uint8_t>(code | 0x80)),
              -e4m3_to_f32(static_cast<uint8_t>(code)));
  }
}

TEST(E4m3, MatchesNearestValueOracle) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<float> inputs;
  for (int n = 0; n < 5000; ++n) inputs.push_back(random_float(rng, -14, 10));
  for (int code = 0; code < 0x7e; ++code) {  // every tie, and one ulp either side
    const float mid = 0.5f * (e4m3_to_f32(static_cast<uint8_t>(code)) +
                              e4m3_to_f32(static_cast<uint8_t>(code + 1)));
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)})
      inputs.insert(inputs.end(), {v, -v});
  }
  for (float v : inputs) ASSERT_EQ(f32_to_e4m3(v), e4m3_oracle(v)) << v;
}

// ------------------------------------------------------------------ e2m1 ----

TEST(E2m1, DecodesEveryCode) {
  const float magnitudes[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int code = 0; code < 16; ++code) {
    const float want = (code & 8) ? -magnitudes[code & 7] : magnitudes[code & 7];
    const float got = e2m1_to_f32(static_cast<uint8_t>(code));
    EXPECT_EQ(got, want) << code;
    EXPECT_EQ(std::signbit(got), (code & 8) != 0) << code;
    EXPECT_EQ(f32_to_e2m1(got), code) << "round trip of " << code;
  }
}

TEST(E2m1, EncodesKnownValues) {
  EXPECT_EQ(f32_to_e2m1(0.25f), 0x0);  // 0 or 0.5: 0 is even
  EXPECT_EQ(f32_to_e2m1(0.26f), 0x1);
  EXPECT_EQ(f32_to_e2m1(0.75f), 0x2);  // 0.5 (code 1) or 1.0 (code 2): 1.0
  EXPECT_EQ(f32_to_e2m1(1.25f), 0x2);  // 1.0 or 1.5
  EXPECT_EQ(f32_to_e2m1(1.75f), 0x4);  // 1.5 or 2.0
  EXPECT_EQ(f32_to_e2m1(2.5f), 0x4);   // 2 or 3
  EXPECT_EQ(f32_to_e2m1(3.5f), 0x6);   // 3 or 4
  EXPECT_EQ(f32_to_e2m1(5.0f), 0x6);   // 4 or 6
  EXPECT_EQ(f32_to_e2m1(5.01f), 0x7);
  EXPECT_EQ(f32_to_e2m1(-0.75f), 0xa);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 0x8);  // rounds to -0
  EXPECT_EQ(f32_to_e2m1(6.5f), 0x7);   // saturates
  EXPECT_EQ(f32_to_e2m1(1e30f), 0x7);
  EXPECT_EQ(f32_to_e2m1(INFINITY), 0x7);
  EXPECT_EQ(f32_to_e2m1(-INFINITY), 0xf);
  EXPECT_EQ(f32_to_e2m1(NAN), 0x7);  // +6 with the input's sign bit
  EXPECT_EQ(f32_to_e2m1(-NAN), 0xf);
}

TEST(E2m1, MatchesNearestValueOracle) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<float> inputs;
  for (int n = 0; n < 5000; ++n) inputs.push_back(random_float(rng, -4, 3));
  for (int code = 0; code < 7; ++code) {
    const float mid = 0.5f * (e2m1_to_f32(static_cast<uint8_t>(code)) +
                              e2m1_to_f32(static_cast<uint8_t>(code + 1)));
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 9.0f)})
      inputs.insert(inputs.end(), {v, -v});
  }
  for (float v : inputs) ASSERT_EQ(f32_to_e2m1(v), e2m1_oracle(v)) << v;
}

TEST(E8m0, DecodesPowersOfTwo) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(128), 2.0f);
  EXPECT_EQ(e8m0_to_f32(126), 0.5f);
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_GT(e8m0_to_f32(0), 0.0f);
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xff)));
}

}  // namespace
}  // namespace unimoe::ref
