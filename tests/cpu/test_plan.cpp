// Presets and the floor arithmetic.
#include <gtest/gtest.h>

#include <cmath>

#include "support/floor.h"
#include "support/presets.h"

namespace unimoe {
namespace {

TEST(Presets, AllValidateAndNamesAreUnique) {
  ASSERT_GE(presets().size(), 9u);
  for (const Preset& p : presets()) {
    SCOPED_TRACE(p.name);
    EXPECT_NO_THROW(validate(p.config));
    EXPECT_EQ(&find_preset(p.name), &p);
  }
}

TEST(Presets, UnknownNameListsKnownOnes) {
  try {
    find_preset("gpt-5");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "preset");
    EXPECT_NE(std::string(e.what()).find("dsv3-tp8"), std::string::npos);
  }
}

TEST(Floor, MatchesTheAnchorFileForDsv3Tp8AtOneToken) {
  // bench/peers/h200-bf16-peers.json: dsv3-tp8 T=1, 8 experts hit,
  // 4.225 TB/s, 677.7 TFLOP/s -> floor 20.9 us (memory-bound).
  const MoEConfig c = find_preset("dsv3-tp8").config;
  const FloorEstimate f = layer_floor(c, 1, 8, {4.225, 677.7});
  EXPECT_NEAR(f.floor_us, 20.9, 0.1);
  EXPECT_DOUBLE_EQ(f.floor_us, f.memory_us);
  EXPECT_DOUBLE_EQ(f.flops, 2.0 * 1 * 8 * 3 * 7168 * 256);
}

TEST(Floor, ComputeBoundAtLargeT) {
  // Anchor: qwen3-30b-a3b T=16384, 128 experts -> 1825.1 us (compute-bound).
  const MoEConfig c = find_preset("qwen3-30b-a3b").config;
  const FloorEstimate f = layer_floor(c, 16384, 128, {4.225, 677.7});
  EXPECT_NEAR(f.floor_us, 1825.1, 1.0);
  EXPECT_DOUBLE_EQ(f.floor_us, f.compute_us);
}

TEST(Floor, ExpectedActiveExperts) {
  EXPECT_DOUBLE_EQ(expected_active_experts(8, 2, 1), 2.0);
  EXPECT_NEAR(expected_active_experts(128, 8, 100000), 128.0, 1e-9);
  EXPECT_NEAR(expected_active_experts(256, 8, 8), 256 * (1 - std::pow(1 - 8.0 / 256, 8)), 1e-9);
}

TEST(Floor, QuantVariantsMoveFewerBytes) {
  MoEConfig c = find_preset("qwen3-30b-a3b").config;
  const double bf16 = layer_floor(c, 1, 8, {4, 600}).bytes;
  c.experts.quant = QuantVariant::MXFP4;
  const double fp4 = layer_floor(c, 1, 8, {4, 600}).bytes;
  EXPECT_LT(fp4, bf16 / 3.5);
}

}  // namespace
}  // namespace unimoe
