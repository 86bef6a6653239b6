// The fp32 sigmoid the reference and the kernels share for DeepSeek's score
// (core/sigmoid_fp32.h): its error against the exact sigmoid over a grid of
// fp32 inputs, and its special values. That host and device give the same
// bits is checked on the GPU (RoutingGpu.DeepSeekScoreIsTheHostsBitForBit).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/sigmoid_fp32.h"

namespace unimoe {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

int32_t bits(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}

// Distance in ulps between `got` and the exact value rounded to fp32 (both
// are >= 0, so their bit patterns order like the values).
int64_t ulps_off(float got, double exact) {
  return std::llabs(static_cast<int64_t>(bits(got)) - bits(static_cast<float>(exact)));
}

double exact_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Every 257th bit pattern (about 16.7 million inputs, both signs, every
// binade, subnormals included), wherever the exact value is a normal float
// (x > -87.33); below -87.34 the score is 0 (flushed). Every
// float, checked once on the CPU: within 2 ulp, non-decreasing
// (docs/routing.md).
TEST(SigmoidFp32, WithinTwoUlpsOverTheFloatRange) {
  int64_t worst = 0, evaluated = 0;
  float worst_x = 0;
  for (uint64_t u = 0; u < (1ull << 32); u += 257) {
    const float x = from_bits(static_cast<uint32_t>(u));
    if (std::isnan(x)) continue;
    ++evaluated;
    if (x <= -87.34f) {  // the exact value is subnormal: flushed
      EXPECT_EQ(sigmoid_fp32(x), 0.0f) << x;
      continue;
    }
    if (x <= -87.33f) continue;  // 2^-126 lies between: normal or flushed
    const int64_t off = ulps_off(sigmoid_fp32(x), exact_sigmoid(x));
    if (off > worst) {
      worst = off;
      worst_x = x;
    }
  }
  EXPECT_GT(evaluated, 16000000);
  EXPECT_LE(worst, 2) << "at x = " << worst_x;
}

// Every float in [-4, -0.5] and [0.5, 4], where routing logits live (about
// 50 million inputs).
TEST(SigmoidFp32, WithinTwoUlpsForEveryFloatOfTypicalLogits) {
  int64_t worst = 0;
  float worst_x = 0;
  for (float sign : {-1.0f, 1.0f})
    for (float a = 0.5f; a <= 4.0f; a = std::nextafter(a, 5.0f)) {
      const float x = sign * a;
      const int64_t off = ulps_off(sigmoid_fp32(x), exact_sigmoid(x));
      if (off > worst) {
        worst = off;
        worst_x = x;
      }
    }
  EXPECT_LE(worst, 2) << "at x = " << worst_x;
}

TEST(SigmoidFp32, SpecialValues) {
  EXPECT_EQ(sigmoid_fp32(0.0f), 0.5f);
  EXPECT_EQ(sigmoid_fp32(-0.0f), 0.5f);
  EXPECT_EQ(sigmoid_fp32(kInf), 1.0f);
  EXPECT_EQ(sigmoid_fp32(-kInf), 0.0f);
  EXPECT_EQ(sigmoid_fp32(std::numeric_limits<float>::quiet_NaN()), 0.0f);  // NaN counts as -inf
  EXPECT_EQ(sigmoid_fp32(20.0f), 1.0f);   // 1 + exp(-20) rounds to 1
  EXPECT_EQ(sigmoid_fp32(1e30f), 1.0f);
  EXPECT_EQ(sigmoid_fp32(-1e30f), 0.0f);
  // Results near the smallest normal float, 2^-126 (x = -87.3365).
  for (float x : {-80.5f, -87.0f, -87.33f})
    EXPECT_LE(ulps_off(sigmoid_fp32(x), exact_sigmoid(x)), 2) << x;
  EXPECT_GE(sigmoid_fp32(-87.33f), 0x1p-126f);
  // Subnormal exact values are flushed to 0, while exp(-x) is finite and
  // where it overflows fp32.
  for (float x : {-87.34f, -88.5f, -88.7f, -90.0f}) EXPECT_EQ(sigmoid_fp32(x), 0.0f) << x;
}

// The score never falls as x rises: every float in [-1, 1] with |x| >= 1/8
// (about 50 million inputs; every float was checked once on the CPU).
TEST(SigmoidFp32, NonDecreasing) {
  int64_t drops = 0;
  float previous = 0, where = 0;
  for (float x = -1.0f; x <= 1.0f; x = std::nextafter(x, 2.0f)) {
    if (std::fabs(x) < 0.125f) x = 0.125f;
    const float s = sigmoid_fp32(x);
    if (s < previous && drops++ == 0) where = x;
    previous = s;
  }
  EXPECT_EQ(drops, 0) << "first at x = " << where;
}

}  // namespace
}  // namespace unimoe
