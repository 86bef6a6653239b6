// The integer e4m3 encoder the fp8 quantize kernels share with the host
// (core/e4m3.h) against the reference's ref::f32_to_e4m3: every midpoint
// between two adjacent codes and its fp32 neighbours (the RNE ties), the
// special values, and every 251st fp32 bit pattern (both signs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "core/e4m3.h"
#include "ref/ref.h"

namespace unimoe {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The first fp32 bit pattern where encode_e4m3 and the reference differ
// among `v` and its two fp32 neighbours, or "" when they agree.
std::string mismatch_near(float v) {
  const float candidates[] = {std::nextafter(v, -INFINITY), v, std::nextafter(v, INFINITY)};
  for (const float c : candidates) {
    const uint8_t got = encode_e4m3(c);
    const uint8_t want = ref::f32_to_e4m3(c);
    if (got != want) {
      uint32_t bits;
      std::memcpy(&bits, &c, sizeof bits);
      return "input bits " + std::to_string(bits) + ": got " + std::to_string(got) + " want " +
             std::to_string(want);
    }
  }
  return "";
}

TEST(E4m3Encode, MatchesReferenceAtEveryTieAndCode) {
  for (int sign = 0; sign < 2; ++sign)
    for (int code = 0; code < 0x7e; ++code) {
      const uint8_t c = static_cast<uint8_t>(code | (sign << 7));
      const float lo = ref::e4m3_to_f32(c);
      const float hi = ref::e4m3_to_f32(static_cast<uint8_t>(c + 1));
      SCOPED_TRACE("code " + std::to_string(c));
      EXPECT_EQ(mismatch_near(lo), "");
      EXPECT_EQ(mismatch_near((lo + hi) / 2), "");  // exact in fp32: a tie
    }
  // Past the largest finite value: 448 itself, the would-be tie with 480, 480.
  for (const float v : {448.0f, 464.0f, 480.0f, 1e30f}) {
    EXPECT_EQ(mismatch_near(v), "");
    EXPECT_EQ(mismatch_near(-v), "");
  }
  // Below the smallest subnormal 2^-9: the tie 2^-10 goes to 0, above it to 0x01.
  EXPECT_EQ(mismatch_near(std::ldexp(1.0f, -10)), "");
  EXPECT_EQ(mismatch_near(-std::ldexp(1.0f, -10)), "");
}

TEST(E4m3Encode, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(encode_e4m3(nan), 0x7f);
  EXPECT_EQ(encode_e4m3(-nan), 0x7f);
  EXPECT_EQ(encode_e4m3(from_bits(0x7f800001u)), 0x7f);  // signalling NaN
  EXPECT_EQ(encode_e4m3(from_bits(0xffc00000u)), 0x7f);  // -NaN
  EXPECT_EQ(encode_e4m3(inf), 0x7e);
  EXPECT_EQ(encode_e4m3(-inf), 0xfe);
  EXPECT_EQ(encode_e4m3(0.0f), 0x00);
  EXPECT_EQ(encode_e4m3(-0.0f), 0x80);
  EXPECT_EQ(encode_e4m3(from_bits(0x00000001u)), 0x00);  // fp32 subnormal
  EXPECT_EQ(encode_e4m3(from_bits(0x80000001u)), 0x80);
  EXPECT_EQ(encode_e4m3(std::numeric_limits<float>::max()), 0x7e);
  EXPECT_EQ(encode_e4m3(1.0f), 0x38);
}

// About 17 million inputs: every exponent, both signs, NaN payloads.
TEST(E4m3Encode, MatchesReferenceOnAStrideOfAllFp32) {
  int errors = 0;
  std::string first;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 251) {
    const float v = from_bits(static_cast<uint32_t>(bits));
    if (encode_e4m3(v) != ref::f32_to_e4m3(v) && errors++ == 0)
      first = "input bits " + std::to_string(bits);
  }
  EXPECT_EQ(errors, 0) << first;
}

}  // namespace
}  // namespace unimoe
