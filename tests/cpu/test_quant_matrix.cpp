// The scaled matrices of the quantization emulation: scale rules and layouts
// recomputed from the wording of ref.h, exactness on inputs that are already
// representable, error bounds on random inputs, and the activation rounding
// of every variant. The number formats alone: test_quant.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "ref/ref.h"

namespace unimoe::ref {
namespace {

constexpr QuantVariant kAllVariants[] = {QuantVariant::BF16, QuantVariant::FP8PerTensor,
                                         QuantVariant::FP8Block128, QuantVariant::MXFP4,
                                         QuantVariant::NVFP4};

uint8_t nibble_at(const std::vector<uint8_t>& data, std::size_t i) {
  return static_cast<uint8_t>((data[i / 2] >> (4 * (i % 2))) & 0xf);
}

float amax_of(const std::vector<float>& v, int cols, int r0, int r1, int c0, int c1) {
  float amax = 0;
  for (int r = r0; r < r1; ++r)
    for (int c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(v[r * cols + c]));
  return amax;
}

// e4m3 keeps 3 mantissa bits: half an ulp is at most 2^-4 of a normal value;
// below the normals the half step is 2^-10 in units of the scale. The small
// relative slack covers the fp32 roundings of x / scale and code * scale.
double fp8_error_bound(float x, float scale) {
  return (0.0625 * std::fabs(x) + std::ldexp(static_cast<double>(scale), -10)) * (1 + 1e-5);
}

// The nibble encodes y correctly when it has y's sign and no e2m1 magnitude
// is nearer to |y| (beyond 6 that is 6: saturation).
void expect_nearest_e2m1(uint8_t nibble, float y) {
  EXPECT_EQ((nibble & 8) != 0, std::signbit(y)) << y;
  const double a = std::fabs(y);
  double nearest = INFINITY;
  for (uint8_t code = 0; code < 8; ++code)
    nearest = std::min(nearest, std::fabs(e2m1_to_f32(code) - a));
  EXPECT_EQ(std::fabs(std::fabs(e2m1_to_f32(nibble)) - a), nearest) << y;
}

// Uniform values in [-1, 1) scaled by 2^k, k drawn per block_rows x block_cols tile.
std::vector<float> blocky_matrix(int rows, int cols, int block_rows, int block_cols, int max_k,
                                 std::mt19937_64& rng) {
  std::uniform_int_distribution<int> k(-max_k, max_k);
  std::vector<int> shifts((rows / block_rows + 1) * (cols / block_cols + 1));
  for (auto& s : shifts) s = k(rng);
  std::vector<float> v = test::random_vector(static_cast<std::size_t>(rows) * cols, rng);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      v[r * cols + c] = std::ldexp(
          v[r * cols + c], shifts[(r / block_rows) * (cols / block_cols + 1) + c / block_cols]);
  return v;
}

TEST(Quantize, LayoutSizes) {
  const int rows = 130, cols = 288;  // ragged for 128 in both directions
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  const std::vector<float> v(n, 0.5f);
  const struct {
    QuantVariant variant;
    std::size_t data, scales, block_scales;
  } cases[] = {
      {QuantVariant::BF16, 2 * n, 0, 0},
      {QuantVariant::FP8PerTensor, n, 1, 0},
      {QuantVariant::FP8Block128, n, 2 * 3, 0},
      {QuantVariant::MXFP4, n / 2, 0, rows * (cols / 32)},
      {QuantVariant::NVFP4, n / 2, 0, rows * (cols / 16)},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(to_string(c.variant));
    const QuantMatrix m = quantize(c.variant, v.data(), rows, cols);
    EXPECT_EQ(m.variant, c.variant);
    EXPECT_EQ(m.rows, rows);
    EXPECT_EQ(m.cols, cols);
    EXPECT_EQ(m.data.size(), c.data);
    EXPECT_EQ(m.scales.size(), c.scales);
    EXPECT_EQ(m.block_scales.size(), c.block_scales);
    EXPECT_EQ(dequantize(m).size(), n);
  }
}

TEST(Quantize, RejectsBadShapes) {
  const std::vector<float> v(64 * 2, 1.0f);
  for (auto [variant, cols, block] :
       {std::tuple{QuantVariant::MXFP4, 48, "32"}, std::tuple{QuantVariant::MXFP4, 16, "32"},
        std::tuple{QuantVariant::NVFP4, 24, "16"}}) {
    try {
      quantize(variant, v.data(), 2, cols);
      ADD_FAILURE() << to_string(variant) << " accepted cols = " << cols;
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "cols");
      EXPECT_NE(std::string(e.what()).find(block), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(quantize(QuantVariant::BF16, v.data(), -1, 4), Error);
  EXPECT_THROW(quantize_activation(QuantVariant::FP8Block128, nullptr, 2, -3), Error);
}

TEST(Quantize, Bf16StoresLittleEndianBits) {
  const std::vector<float> v = {1.0f, -2.5f, 1.0f + 3.0f / 256};  // the last is a tie: rounds up
  const QuantMatrix m = quantize(QuantVariant::BF16, v.data(), 1, 3);
  EXPECT_EQ(m.data, (std::vector<uint8_t>{0x80, 0x3f, 0x20, 0xc0, 0x82, 0x3f}));
  const std::vector<float> back = dequantize(m);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(back[i], round_bf16(v[i]));
}

// The scale of each tile is its amax / 448, the codes are x / scale rounded,
// and the tile's largest element lands on +-448.
TEST(Quantize, Fp8ScalesFollowTheTileAmax) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int rows = 150, cols = 260;
  const std::vector<float> v = blocky_matrix(rows, cols, 128, 128, 6, rng);
  for (auto [variant, tile] : {std::pair{QuantVariant::FP8PerTensor, 1 << 20},
                               std::pair{QuantVariant::FP8Block128, 128}}) {
    SCOPED_TRACE(to_string(variant));
    const QuantMatrix m = quantize(variant, v.data(), rows, cols);
    const int grid_rows = (rows + tile - 1) / tile, grid_cols = (cols + tile - 1) / tile;
    ASSERT_EQ(m.scales.size(), static_cast<std::size_t>(grid_rows * grid_cols));
    std::vector<float> tile_amax;
    for (int br = 0; br < grid_rows; ++br)
      for (int bc = 0; bc < grid_cols; ++bc)
        tile_amax.push_back(amax_of(v, cols, br * tile, std::min(rows, (br + 1) * tile), bc * tile,
                                    std::min(cols, (bc + 1) * tile)));
    const std::vector<float> back = dequantize(m);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const int br = r / tile, bc = c / tile;
        const float amax = tile_amax[br * grid_cols + bc];
        const float scale = m.scales[br * grid_cols + bc];
        ASSERT_EQ(scale, amax / 448.0f) << r << "," << c;
        const int i = r * cols + c;
        ASSERT_EQ(m.data[i], f32_to_e4m3(v[i] / scale)) << r << "," << c;
        ASSERT_LE(std::fabs(back[i] - v[i]), fp8_error_bound(v[i], scale)) << r << "," << c;
        if (std::fabs(v[i]) == amax) {
          EXPECT_EQ(m.data[i] & 0x7f, 0x7e) << r << "," << c;
        }
      }
  }
}

// Scale 2^(floor(log2(amax)) - 2) per 32 values of a row, elements the
// nearest e2m1 of x / scale, dequantized exactly.
TEST(Quantize, Mxfp4FollowsTheOcpScaleRule) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int rows = 7, cols = 96;
  const std::vector<float> v = blocky_matrix(rows, cols, 1, 32, 20, rng);
  const QuantMatrix m = quantize(QuantVariant::MXFP4, v.data(), rows, cols);
  const std::vector<float> back = dequantize(m);
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < cols / 32; ++b) {
      const float amax = amax_of(v, cols, r, r + 1, 32 * b, 32 * b + 32);
      int exp;
      std::frexp(amax, &exp);  // amax = f * 2^exp, f in [0.5, 1): floor(log2) = exp - 1
      const float scale = e8m0_to_f32(m.block_scales[r * (cols / 32) + b]);
      ASSERT_EQ(scale, std::ldexp(1.0f, exp - 1 - 2)) << r << "," << b;
      for (int c = 32 * b; c < 32 * b + 32; ++c) {
        const int i = r * cols + c;
        expect_nearest_e2m1(nibble_at(m.data, i), v[i] / scale);
        EXPECT_EQ(back[i], e2m1_to_f32(nibble_at(m.data, i)) * scale);
      }
    }
}

TEST(Quantize, Mxfp4PacksLowColumnInLowNibble) {
  std::vector<float> v(64, 0.0f);  // the first block stays zero
  const float row[4] = {1.0f, -2.0f, 0.5f, 6.0f};
  for (int c = 0; c < 4; ++c) v[32 + c] = row[c];
  const QuantMatrix m = quantize(QuantVariant::MXFP4, v.data(), 1, 64);
  EXPECT_EQ(m.block_scales, (std::vector<uint8_t>{0, 127}));  // 2^-127 for zeros, 2^(2-2)
  EXPECT_EQ(m.data[16], 0xc2);                                // low: 1.0 (0x2), high: -2.0 (0xc)
  EXPECT_EQ(m.data[17], 0x71);                                // low: 0.5 (0x1), high: 6.0 (0x7)
  EXPECT_EQ(dequantize(m), v);
}

// global = amax / (448 * 6); block scale e4m3(block amax / 6 / global);
// elements the nearest e2m1 of x / (block scale * global).
TEST(Quantize, Nvfp4TwoLevelScales) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int rows = 5, cols = 64;
  const std::vector<float> v = blocky_matrix(rows, cols, 1, 16, 4, rng);
  const QuantMatrix m = quantize(QuantVariant::NVFP4, v.data(), rows, cols);
  const std::vector<float> back = dequantize(m);
  ASSERT_EQ(m.global_scale, amax_of(v, cols, 0, rows, 0, cols) / 2688.0f);
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < cols / 16; ++b) {
      const float amax = amax_of(v, cols, r, r + 1, 16 * b, 16 * b + 16);
      const uint8_t code = m.block_scales[r * (cols / 16) + b];
      ASSERT_EQ(code, f32_to_e4m3(amax / 6.0f / m.global_scale)) << r << "," << b;
      const float block_scale = e4m3_to_f32(code);
      for (int c = 16 * b; c < 16 * b + 16; ++c) {
        const int i = r * cols + c;
        expect_nearest_e2m1(nibble_at(m.data, i), v[i] / (block_scale * m.global_scale));
        EXPECT_EQ(back[i], e2m1_to_f32(nibble_at(m.data, i)) * block_scale * m.global_scale);
      }
    }
}

TEST(Quantize, Nvfp4BlockScaleOfZeroGivesZeros) {
  std::vector<float> v(32, 1e-4f);
  v[0] = 2688.0f;  // global = 1; the second block's scale 1e-4 / 6 rounds to e4m3 0
  const QuantMatrix m = quantize(QuantVariant::NVFP4, v.data(), 1, 32);
  EXPECT_EQ(m.global_scale, 1.0f);
  EXPECT_EQ(m.block_scales[1], 0);
  const std::vector<float> back = dequantize(m);
  for (int c = 16; c < 32; ++c) EXPECT_EQ(back[c], 0.0f) << c;
  EXPECT_EQ(back[0], 2688.0f);
}

// Inputs built from codes and power-of-two scales, with each block's largest
// code present so that the scale rule recovers exactly the scale used.
TEST(Quantize, RepresentableInputsAreExact) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto e4m3_value = [&](int lo_code, int hi_code) {
    const float v = e4m3_to_f32(static_cast<uint8_t>(pick(lo_code, hi_code)));
    return pick(0, 1) ? -v : v;
  };
  auto e2m1_value = [&] { return e2m1_to_f32(static_cast<uint8_t>(pick(0, 15))); };
  const int rows = 150, cols = 256;
  std::vector<float> v(rows * cols);
  auto check = [&](QuantVariant variant) {
    SCOPED_TRACE(to_string(variant));
    EXPECT_EQ(dequantize(quantize(variant, v.data(), rows, cols)), v);
  };

  for (auto& x : v) x = round_bf16(std::uniform_real_distribution<float>(-9, 9)(rng));
  check(QuantVariant::BF16);

  const int k = pick(-20, 20);
  for (auto& x : v) x = std::ldexp(e4m3_value(0, 0x7e), k);
  v[pick(0, rows * cols - 1)] = std::ldexp(448.0f, k);
  check(QuantVariant::FP8PerTensor);

  for (int br = 0; br < rows; br += 128)
    for (int bc = 0; bc < cols; bc += 128) {
      const int kb = pick(-20, 20);
      for (int r = br; r < std::min(rows, br + 128); ++r)
        for (int c = bc; c < bc + 128; ++c) v[r * cols + c] = std::ldexp(e4m3_value(0, 0x7e), kb);
      v[br * cols + bc + pick(0, 127)] = std::ldexp(-448.0f, kb);
    }
  check(QuantVariant::FP8Block128);

  for (int b = 0; b < rows * cols / 32; ++b) {
    const int kb = pick(-30, 30);
    for (int i = 32 * b; i < 32 * b + 32; ++i) v[i] = std::ldexp(e2m1_value(), kb);
    v[32 * b + pick(0, 31)] = std::ldexp(pick(0, 1) ? 6.0f : -4.0f, kb);  // floor(log2) = kb + 2
  }
  check(QuantVariant::MXFP4);

  const int global_shift = pick(-10, 10);
  for (int b = 0; b < rows * cols / 16; ++b) {
    const float block_scale = b == 0 ? 448.0f : std::fabs(e4m3_value(0x20, 0x7e));
    for (int i = 16 * b; i < 16 * b + 16; ++i)
      v[i] = std::ldexp(e2m1_value() * block_scale, global_shift);
    v[16 * b + pick(0, 15)] = std::ldexp(6.0f * block_scale, global_shift);
  }
  check(QuantVariant::NVFP4);
}

TEST(Quantize, ZeroAndEmptyMatrices) {
  const std::vector<float> zeros(4 * 64, 0.0f);
  for (QuantVariant variant : kAllVariants) {
    SCOPED_TRACE(to_string(variant));
    const QuantMatrix m = quantize(variant, zeros.data(), 4, 64);
    EXPECT_EQ(dequantize(m), zeros);
    for (float s : m.scales) EXPECT_EQ(s, 1.0f);
    for (uint8_t s : m.block_scales) EXPECT_EQ(s, 0);  // e8m0 2^-127 / e4m3 zero
    EXPECT_EQ(m.global_scale, 1.0f);

    const QuantMatrix empty = quantize(variant, nullptr, 0, 64);
    EXPECT_TRUE(empty.data.empty());
    EXPECT_EQ(empty.scales.size(), variant == QuantVariant::FP8PerTensor ? 1u : 0u);
    EXPECT_TRUE(dequantize(empty).empty());
    quantize_activation(variant, nullptr, 0, 64);
  }
}

// Uniform values in [-1, 1): bounds a little above what each format gives
// (measured: bf16 0.0015, fp8 0.026, MXFP4 0.145, NVFP4 0.102). MXFP4 is the
// coarsest: its power-of-two scale puts amax anywhere in [4, 8) times the
// scale, so the top of a block saturates to 6.
TEST(Quantize, RandomMatricesWithinRelativeError) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int rows = 64, cols = 256;
  const std::vector<float> v = test::random_vector(rows * cols, rng);
  const std::pair<QuantVariant, double> bounds[] = {
      {QuantVariant::BF16, 0.003},        {QuantVariant::FP8PerTensor, 0.035},
      {QuantVariant::FP8Block128, 0.035}, {QuantVariant::MXFP4, 0.17},
      {QuantVariant::NVFP4, 0.12},
  };
  for (auto [variant, bound] : bounds) {
    const double err = test::rel_l2(dequantize(quantize(variant, v.data(), rows, cols)), v);
    EXPECT_LT(err, bound) << to_string(variant);
    EXPECT_GT(err, 0.0) << to_string(variant);  // random fp32 inputs never all survive
  }
}

TEST(QuantizeActivation, Bf16VariantsRoundEachValue) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<float> v = test::random_vector(3 * 100, rng, -50, 50);  // any cols
  for (QuantVariant variant : {QuantVariant::BF16, QuantVariant::MXFP4, QuantVariant::NVFP4}) {
    std::vector<float> out = v;
    quantize_activation(variant, out.data(), 3, 100);
    for (std::size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(out[i], round_bf16(v[i])) << to_string(variant);
  }
}

// Near ties: the other code's value for elements within the margin of a
// rounding boundary (relative to the quotient), NaN elsewhere; the scale is
// quantize_activation's (static 2 here); the neighbour keeps the sign, and
// there is none past e4m3's largest finite magnitude or below 0.
TEST(QuantizeActivation, Fp8NearTiesNameTheOtherCode) {
  // Quotients: 9.500095 (rounds to 10, boundary 9.5 with 9), its negative,
  // 9.75 (far from 9.5 and 10.5), 0, 500 (saturates), 2.37498 (rounds to
  // 2.25, boundary 2.375 with 2.5).
  const std::vector<float> v = {19.00019f, -19.00019f, 19.5f, 0.0f, 1000.0f, 4.7499525f};
  const std::vector<float> ties =
      fp8_near_ties(QuantVariant::FP8PerTensor, v.data(), 1, 6, 2.0f, 1e-4);
  EXPECT_FLOAT_EQ(ties[0], 18.0f);
  EXPECT_FLOAT_EQ(ties[1], -18.0f);
  EXPECT_TRUE(std::isnan(ties[2]));
  EXPECT_TRUE(std::isnan(ties[3]));
  EXPECT_TRUE(std::isnan(ties[4]));
  EXPECT_FLOAT_EQ(ties[5], 5.0f);
  // A margin below the first element's distance (1e-5) leaves it out.
  EXPECT_TRUE(std::isnan(fp8_near_ties(QuantVariant::FP8PerTensor, v.data(), 1, 6, 2.0f, 1e-6)[0]));
  for (float t : fp8_near_ties(QuantVariant::BF16, v.data(), 1, 6, 0.0f, 1e-4))
    EXPECT_TRUE(std::isnan(t));
}

// A per-element slack (absolute, in the values' units) widens "near" for
// that element alone: 19.6 (quotient 9.8, 0.3 from the boundary 9.5 with
// 9, scale 2) is a tie with a slack of 0.61 (0.305 in quotient units) and
// not with 0.59; the relative margin still holds where the slack is 0.
TEST(QuantizeActivation, Fp8NearTiesTakeAPerElementSlack) {
  const std::vector<float> v = {19.6f, 19.6f, 19.00019f};
  const std::vector<float> slack = {0.61f, 0.59f, 0.0f};
  const std::vector<float> ties =
      fp8_near_ties(QuantVariant::FP8PerTensor, v.data(), 1, 3, 2.0f, 1e-4, slack.data());
  EXPECT_FLOAT_EQ(ties[0], 18.0f);
  EXPECT_TRUE(std::isnan(ties[1]));
  EXPECT_FLOAT_EQ(ties[2], 18.0f);
}

TEST(QuantizeActivation, Fp8PerTensorUsesOneDynamicScale) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int rows = 10, cols = 100;
  const std::vector<float> v = blocky_matrix(rows, cols, 1, 100, 3, rng);
  std::vector<float> out = v;
  quantize_activation(QuantVariant::FP8PerTensor, out.data(), rows, cols);
  EXPECT_EQ(out, dequantize(quantize(QuantVariant::FP8PerTensor, v.data(), rows, cols)));
  const float scale = amax_of(v, cols, 0, rows, 0, cols) / 448.0f;
  for (int i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(out[i], e4m3_to_f32(f32_to_e4m3(v[i] / scale)) * scale) << i;
    ASSERT_LE(std::fabs(out[i] - v[i]), fp8_error_bound(v[i], scale)) << i;
  }
}

// Rows 10^6 apart keep their own scales: a shared one would flush the small
// row to zero.
TEST(QuantizeActivation, Fp8Block128ScalesPerRowAnd128Columns) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int rows = 4, cols = 300;  // groups of 128, 128 and 44 columns
  std::vector<float> v = blocky_matrix(rows, cols, 1, 128, 8, rng);
  const float row_factor[rows] = {1e-3f, 1e3f, 1.0f, std::ldexp(1.0f, -20)};
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) v[r * cols + c] *= row_factor[r];
  std::vector<float> out = v;
  quantize_activation(QuantVariant::FP8Block128, out.data(), rows, cols);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const int g = c / 128;
      const float scale =
          amax_of(v, cols, r, r + 1, 128 * g, std::min(cols, 128 * g + 128)) / 448.0f;
      const int i = r * cols + c;
      ASSERT_EQ(out[i], e4m3_to_f32(f32_to_e4m3(v[i] / scale)) * scale) << r << "," << c;
      ASSERT_LE(std::fabs(out[i] - v[i]), fp8_error_bound(v[i], scale)) << r << "," << c;
    }
    EXPECT_LT(test::rel_l2(out.data() + r * cols, v.data() + r * cols, cols), 0.05) << r;
  }
}

}  // namespace
}  // namespace unimoe::ref
