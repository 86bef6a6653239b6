// The host/device 4-bit rules of core/e2m1.h against the reference:
// encode_e2m1 against ref::f32_to_e2m1 at every tie between two adjacent
// codes and its fp32 neighbours, the special values, and every 251st fp32
// bit pattern; nvfp4_block_scale_value against ref::e4m3_to_f32 on every
// code; and whole matrices quantized the way the device kernels do
// (kernels/quant/fp4_weights.cu: amax by fmaxf, then these rules) against
// ref::quantize, bit for bit, codes, block scales and the NVFP4 matrix scale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/e2m1.h"
#include "core/hash_random.h"
#include "ref/ref.h"

namespace unimoe {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The first input among v and its two fp32 neighbours where encode_e2m1 and
// the reference differ, or "" when they agree.
std::string mismatch_near(float v) {
  const float candidates[] = {std::nextafter(v, -kInf), v, std::nextafter(v, kInf)};
  for (const float c : candidates) {
    const uint8_t got = encode_e2m1(c);
    const uint8_t want = ref::f32_to_e2m1(c);
    if (got != want)
      return "input bits " + std::to_string(bits_of(c)) + ": got " + std::to_string(got) + " want " +
             std::to_string(want);
  }
  return "";
}

TEST(E2m1Encode, MatchesReferenceAtEveryTieAndCode) {
  for (int sign = 0; sign < 2; ++sign)
    for (int code = 0; code < 7; ++code) {
      const uint8_t c = static_cast<uint8_t>(code | (sign << 3));
      const float lo = ref::e2m1_to_f32(c);
      const float hi = ref::e2m1_to_f32(static_cast<uint8_t>(c + 1));
      SCOPED_TRACE("code " + std::to_string(c));
      EXPECT_EQ(mismatch_near(lo), "");
      EXPECT_EQ(mismatch_near((lo + hi) / 2), "");  // exact in fp32: a tie
    }
  // 6 itself, the would-be tie with 8, 8, and far beyond; below 0.5, the tie 0.25.
  for (const float v : {6.0f, 7.0f, 8.0f, 1e30f, 0.25f, 0.125f}) {
    EXPECT_EQ(mismatch_near(v), "");
    EXPECT_EQ(mismatch_near(-v), "");
  }
}

TEST(E2m1Encode, SpecialValues) {
  EXPECT_EQ(encode_e2m1(kNan), 0x7);
  EXPECT_EQ(encode_e2m1(-kNan), 0xf);  // NaN keeps its sign
  EXPECT_EQ(encode_e2m1(from_bits(0x7f800001u)), 0x7);  // signalling NaN
  EXPECT_EQ(encode_e2m1(from_bits(0xffc00000u)), 0xf);
  EXPECT_EQ(encode_e2m1(kInf), 0x7);
  EXPECT_EQ(encode_e2m1(-kInf), 0xf);
  EXPECT_EQ(encode_e2m1(0.0f), 0x0);
  EXPECT_EQ(encode_e2m1(-0.0f), 0x8);
  EXPECT_EQ(encode_e2m1(-0.1f), 0x8);
  EXPECT_EQ(encode_e2m1(from_bits(0x00000001u)), 0x0);  // fp32 subnormal
  EXPECT_EQ(encode_e2m1(from_bits(0x80000001u)), 0x8);
  EXPECT_EQ(encode_e2m1(0.75f), 0x2);  // the tie goes to 1.0, the even code
  EXPECT_EQ(encode_e2m1(5.0f), 0x6);
  EXPECT_EQ(encode_e2m1(-3.5f), 0xe);
  for (int c = 0; c < 16; ++c) EXPECT_EQ(encode_e2m1(ref::e2m1_to_f32(static_cast<uint8_t>(c))), c);
}

// About 17 million inputs: every exponent, both signs, NaN payloads.
TEST(E2m1Encode, MatchesReferenceOnAStrideOfAllFp32) {
  int errors = 0;
  std::string first;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 251) {
    const float v = from_bits(static_cast<uint32_t>(bits));
    if (encode_e2m1(v) != ref::f32_to_e2m1(v) && errors++ == 0) first = "input bits " + std::to_string(bits);
  }
  EXPECT_EQ(errors, 0) << first;
}

TEST(E2m1Encode, BlockScaleValueIsTheReferenceE4m3) {
  for (int c = 0; c < 256; ++c) {
    const float got = nvfp4_block_scale_value(static_cast<uint8_t>(c));
    const float want = ref::e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(got)) << c;
    else
      EXPECT_EQ(bits_of(got), bits_of(want)) << c;
  }
}

// ---- whole matrices, the device's order of work --------------------------

// ref::QuantMatrix's data, block_scales and global_scale, as the kernels
// compute them: amax by fmaxf from 0 (skipping NaN), then core/e2m1.h.
ref::QuantMatrix device_rules(QuantVariant q, const std::vector<float>& v, int rows, int cols) {
  const int block = q == QuantVariant::MXFP4 ? 32 : 16;
  ref::QuantMatrix m;
  m.variant = q;
  m.rows = rows;
  m.cols = cols;
  m.data.assign(v.size() / 2, 0);
  m.block_scales.resize(v.size() / block);
  float matrix_amax = 0.0f;
  for (const float x : v) matrix_amax = std::fmax(matrix_amax, std::fabs(x));
  const float global = q == QuantVariant::NVFP4 ? nvfp4_global_scale(matrix_amax) : 1.0f;
  m.global_scale = global;
  for (std::size_t b = 0; b < m.block_scales.size(); ++b) {
    float amax = 0.0f;
    for (int k = 0; k < block; ++k) amax = std::fmax(amax, std::fabs(v[b * block + k]));
    const uint8_t code = q == QuantVariant::MXFP4 ? mx_scale_code(amax) : nvfp4_block_code(amax, global);
    m.block_scales[b] = code;
    const float divisor = nvfp4_divisor(code, global);
    for (int k = 0; k < block; ++k) {
      const std::size_t i = b * block + k;
      const uint8_t nibble = q == QuantVariant::MXFP4 ? mx_encode(v[i], code) : nv_encode(v[i], divisor);
      m.data[i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? nibble : nibble << 4);
    }
  }
  return m;
}

void expect_same(const ref::QuantMatrix& got, const ref::QuantMatrix& want) {
  EXPECT_EQ(got.block_scales, want.block_scales);
  EXPECT_EQ(bits_of(got.global_scale), bits_of(want.global_scale));
  int errors = 0;
  std::size_t first = 0;
  for (std::size_t i = 0; i < want.data.size(); ++i)
    if (got.data[i] != want.data[i] && errors++ == 0) first = i;
  EXPECT_EQ(errors, 0) << "code bytes, first at " << first;
}

constexpr QuantVariant kVariants[] = {QuantVariant::MXFP4, QuantVariant::NVFP4};

// Values spread over many binades, with the cases each rule has to get
// right planted in them: an all-zero block, -0, NaN of both signs, a block
// tiny next to the matrix amax (its NVFP4 scale rounds to 0), elements
// past the saturation point (a block of one large value among small ones),
// fp32 subnormals, and a block of exact e2m1 values.
TEST(E2m1Encode, DeviceRulesMatchReferenceMatrices) {
  for (const QuantVariant q : kVariants)
    for (const int spread : {0, 4, 40}) {
      SCOPED_TRACE(to_string(q) + " spread " + std::to_string(spread));
      const int rows = 9, cols = 128;
      std::vector<float> v(static_cast<std::size_t>(rows) * cols);
      for (std::size_t i = 0; i < v.size(); ++i) {
        const int e = static_cast<int>(hash64(i ^ 0x77) % (2 * spread + 1)) - spread;
        v[i] = std::ldexp(hash_uniform(0xe2 + spread, i), e);
      }
      for (int c = 0; c < 32; ++c) v[c] = (c % 3 == 0) ? -0.0f : 0.0f;  // all-zero block(s)
      v[40] = kNan;
      v[41] = -kNan;
      for (int c = 64; c < 96; ++c) v[c] = 1e-30f * (c - 80);  // tiny next to the amax
      v[130] = 1e4f;                                           // the rest of its block saturates
      v[131] = -7.5e3f;
      v[200] = from_bits(0x00000005u);
      v[201] = from_bits(0x80400000u);
      for (int c = 0; c < 32; ++c) v[3 * cols + c] = ref::e2m1_to_f32(static_cast<uint8_t>(c % 16)) * 0.25f;
      expect_same(device_rules(q, v, rows, cols), ref::quantize(q, v.data(), rows, cols));
    }
}

// Block amaxes over the whole fp32 range (every 65537th non-negative
// pattern, and 0, the subnormals' edges and the largest finite value),
// each with 31 random companions below it: the block scale and every
// element.
TEST(E2m1Encode, DeviceRulesMatchReferenceOverTheAmaxRange) {
  std::vector<uint32_t> amaxes = {0u, 1u, 0x007fffffu, 0x00800000u, 0x7f7fffffu};
  for (uint32_t b = 3; b < 0x7f800000u; b += 65537) amaxes.push_back(b);
  for (const QuantVariant q : kVariants) {
    SCOPED_TRACE(to_string(q));
    int errors = 0;
    uint32_t first = 0;
    for (const uint32_t a : amaxes) {
      const float amax = from_bits(a);
      std::vector<float> v(32);
      for (int k = 0; k < 32; ++k) v[k] = amax * hash_uniform(a, k);
      v[a % 32] = (a & 1) ? -amax : amax;
      const ref::QuantMatrix want = ref::quantize(q, v.data(), 1, 32);
      const ref::QuantMatrix got = device_rules(q, v, 1, 32);
      const bool same = got.data == want.data && got.block_scales == want.block_scales &&
                        bits_of(got.global_scale) == bits_of(want.global_scale);
      if (!same && errors++ == 0) first = a;
    }
    EXPECT_EQ(errors, 0) << "first at amax bits " << first;
  }
}

}  // namespace
}  // namespace unimoe
