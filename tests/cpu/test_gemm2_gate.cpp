// The GEMM2 gate's host side (plan/gemm2_gate.h): which calls are gated,
// what the development knob forces, and the cost model the gate kernel
// evaluates (the kernel calls the same gemm2_model_choice).
#include <gtest/gtest.h>

#include <string>

#include "dev/overrides.h"
#include "plan/gemm2_gate.h"
#include "plan/layer_plan.h"
#include "plan/routing_plan.h"
#include "support/presets.h"

namespace unimoe {
namespace {

MoEConfig preset(const std::string& name) { return find_preset(name).config; }

LayerPlan whole_plan(const MoEConfig& c, int tokens, const DevOverrides& dev = {}) {
  return plan_layer(c, tokens, false, RoutingDeviceCaps{}, dev);
}

TEST(Gemm2Gate, CombineServesBf16CallsOfAtMostItsRows) {
  const MoEConfig dsv3 = preset("dsv3-tp8");  // K = 8
  EXPECT_TRUE(combine_serves(dsv3, 1));
  EXPECT_TRUE(combine_serves(dsv3, kCombineMaxRows / 8));
  EXPECT_FALSE(combine_serves(dsv3, kCombineMaxRows / 8 + 1));
  EXPECT_FALSE(combine_serves(dsv3, 0));
  MoEConfig fp8 = dsv3;
  fp8.experts.quant = QuantVariant::FP8Block128;
  EXPECT_FALSE(combine_serves(fp8, 1));
  MoEConfig w4 = preset("gpt-oss-120b");
  w4.experts.quant = QuantVariant::MXFP4;
  EXPECT_FALSE(combine_serves(w4, 1));
}

TEST(Gemm2Gate, TheRuleKeepsTheExpertPathAndTheKnobGatesWhereTheCombineServes) {
  const MoEConfig dsv3 = preset("dsv3-tp8");
  for (int t : {1, 128, 129, 4096}) EXPECT_EQ(whole_plan(dsv3, t).gemm2_mode, Gemm2Mode::Expert);
  DevOverrides gate;
  gate.set("gemm2_path=gate");
  EXPECT_EQ(whole_plan(dsv3, 1, gate).gemm2_mode, Gemm2Mode::Gate);
  EXPECT_EQ(whole_plan(dsv3, 1, gate).path, ExpertsPath::Stream);
  EXPECT_EQ(whole_plan(dsv3, 128, gate).gemm2_mode, Gemm2Mode::Gate);
  EXPECT_EQ(whole_plan(dsv3, 128, gate).path, ExpertsPath::Mma);
  EXPECT_EQ(whole_plan(dsv3, 129, gate).gemm2_mode, Gemm2Mode::Expert);
  // The cutlass path is never gated, even where the rows would fit.
  MoEConfig cutlass = dsv3;
  cutlass.options.backend = "cutlass";
  EXPECT_EQ(whole_plan(cutlass, 1, gate).gemm2_mode, Gemm2Mode::Expert);
  EXPECT_EQ(whole_plan(dsv3, 1, gate).to_string(),
            "path=stream tile_m=16 gemm1=stream_m16 gemm2=stream_m16 gemm2_path=gate");
  // Ungated plans print as before.
  EXPECT_EQ(whole_plan(dsv3, 1).to_string(), "path=stream tile_m=16 gemm1=stream_m16 gemm2=stream_m16");
  EXPECT_EQ(whole_plan(dsv3, 4096, gate).to_string().find("gemm2_path"), std::string::npos);
}

TEST(Gemm2Gate, TheKnobForcesAPathOnlyWhereTheCombineServes) {
  const MoEConfig dsv3 = preset("dsv3-tp8");
  DevOverrides dev;
  dev.set("gemm2_path=expert");
  EXPECT_EQ(whole_plan(dsv3, 1, dev).gemm2_mode, Gemm2Mode::Expert);
  dev.set("gemm2_path=combine");
  EXPECT_EQ(whole_plan(dsv3, 1, dev).gemm2_mode, Gemm2Mode::Combine);
  EXPECT_EQ(whole_plan(dsv3, 4096, dev).gemm2_mode, Gemm2Mode::Expert);
  dev.set("gemm2_path=gate");
  EXPECT_EQ(whole_plan(dsv3, 8, dev).gemm2_mode, Gemm2Mode::Gate);
  EXPECT_EQ(gemm2_mode_for(dsv3, 8, ExpertsPath::Cutlass, dev), Gemm2Mode::Expert);
}

TEST(Gemm2Gate, ModelPicksTheCombineWhereItSavesManyRowsAndTheExpertPathElsewhere) {
  const MoEConfig kimi = preset("kimi-k2");  // H 7168, I 2048
  const Gemm2GateModel m = gemm2_gate_model(kimi);
  // One token: one 16-row chunk a tile, so both stream W2 once; the y
  // round trip of 8 rows saves less than the combine kernel's slower GEMM.
  Gemm2Work decode;
  decode.tiles = decode.chunks = decode.active = 8;
  decode.rows = 8;
  EXPECT_EQ(gemm2_model_choice(m, decode), Gemm2Path::Expert);
  // 32 tokens over 256 one-row tiles: 256 rows of y saved.
  Gemm2Work batch;
  batch.tiles = batch.chunks = batch.active = batch.rows = 256;
  EXPECT_EQ(gemm2_model_choice(m, batch), Gemm2Path::Combine);
  EXPECT_LT(gemm2_path_cost(m.combine, batch), gemm2_path_cost(m.expert, batch));
  // One hot expert with 512 rows in 4 tiles of 128: the combine would make
  // 32 passes over its W2, 28 of them re-reads.
  Gemm2Work hot;
  hot.tiles = 4;
  hot.chunks = 32;
  hot.active = 1;
  hot.rows = 512;
  EXPECT_EQ(gemm2_model_choice(m, hot), Gemm2Path::Expert);
  // The terms are each path's stated costs.
  const float w2_bytes = 7168.0f * 2048.0f * 2.0f;
  EXPECT_NEAR(gemm2_path_cost(m.expert, decode) - gemm2_path_cost(m.expert, Gemm2Work{}),
              8 * (w2_bytes / 2860.0f) + 8 * (4.0f * 7168.0f / 2860.0f), 1.0f);
  EXPECT_EQ(m.expert.base, 0.0f);
  EXPECT_GT(m.combine.base, 1000.0f);
}

TEST(Gemm2Gate, CostIsFusedMultiplyAddsInAFixedOrder) {
  Gemm2PathCost c;
  c.base = 1.0f;
  c.per_tile = 2.0f;
  c.per_row = 3.0f;
  c.per_active = 5.0f;
  c.per_chunk = 7.0f;
  Gemm2Work w;
  w.tiles = 1;
  w.rows = 10;
  w.active = 100;
  w.chunks = 1000;
  EXPECT_EQ(gemm2_path_cost(c, w), 1.0f + 2.0f + 30.0f + 500.0f + 7000.0f);
  // A tie keeps the expert path (the combine must be strictly cheaper).
  Gemm2GateModel tie;
  tie.expert = c;
  tie.combine = c;
  EXPECT_EQ(gemm2_model_choice(tie, w), Gemm2Path::Expert);
  EXPECT_STREQ(gemm2_mode_name(Gemm2Mode::Gate), "gate");
  EXPECT_STREQ(gemm2_mode_name(Gemm2Mode::Combine), "combine");
  EXPECT_STREQ(gemm2_mode_name(Gemm2Mode::Expert), "expert");
}

}  // namespace
}  // namespace unimoe
