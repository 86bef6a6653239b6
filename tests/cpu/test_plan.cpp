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

TEST(Floor, StageFloorsFollowTheStageContracts) {
  // dsv3-tp8 (E=256, K=8, H=7168, I=256, gated), T=1, 8 experts hit.
  const MoEConfig c = find_preset("dsv3-tp8").config;
  const Ceilings ceil{4.0, 600.0};
  const std::vector<StageFloor> s = stage_floors(c, 1, 8, ceil);
  ASSERT_EQ(s.size(), 5u);
  const char* names[] = {"routing", "permute", "gemm1", "gemm2", "finalize"};
  for (int i = 0; i < 5; ++i) EXPECT_STREQ(s[i].stage, names[i]);
  EXPECT_DOUBLE_EQ(s[0].bytes, 256.0 * 4 + 8 * 8);                           // f32 logits; ids, weights
  EXPECT_DOUBLE_EQ(s[2].bytes, 8.0 * 512 * 7168 * 2 + 7168 * 2 + 8 * 256 * 2);  // W13, x, act
  EXPECT_DOUBLE_EQ(s[3].bytes, 8.0 * 7168 * 256 * 2 + 8 * 256 * 2 + 8 * 7168 * 2);
  EXPECT_DOUBLE_EQ(s[4].bytes, 8.0 * 7168 * 2 + 7168 * 2);
  EXPECT_DOUBLE_EQ(s[2].flops + s[3].flops, layer_floor(c, 1, 8, ceil).flops);
  EXPECT_DOUBLE_EQ(s[3].floor_us, s[3].bytes / 4e6);  // memory-bound at T=1
  // The stages move the layer's bytes and their intermediates: more in all.
  double sum = 0;
  for (const StageFloor& f : s) sum += f.floor_us;
  EXPECT_GT(sum, layer_floor(c, 1, 8, ceil).floor_us);
  // Compute-bound GEMMs at large T, on the e4m3 rate for FP8, whose act is
  // one byte plus a scale per 128 values.
  MoEConfig q = c;
  q.experts.quant = QuantVariant::FP8Block128;
  const Ceilings both{4.0, 600.0, 1200.0};
  const std::vector<StageFloor> big = stage_floors(q, 16384, 256, both);
  EXPECT_DOUBLE_EQ(big[2].floor_us, big[2].flops / 1200e6);
  const double rows = 16384.0 * 8;
  EXPECT_NEAR(big[3].bytes, 256.0 * 7168 * 256 * weight_bytes_per_value(q.experts.quant) +
                                rows * 256 * (1 + 4.0 / 128) + rows * 7168 * 2,
              1.0);
}

TEST(Floor, BandwidthIsTheFasterOfCopyAndRead) {
  EXPECT_DOUBLE_EQ(floor_bandwidth(3.97, 4.41), 4.41);
  EXPECT_DOUBLE_EQ(floor_bandwidth(4.41, 3.97), 4.41);
  EXPECT_DOUBLE_EQ(floor_bandwidth(3.9, 0), 3.9);  // read not measured
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
