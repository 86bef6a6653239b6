// The shapes unimoe-bench times (support/shapes.h): presets by name, or the
// one shape of --config or --hf-config, with --quant applied, and the
// command-line combinations it refuses.
#include <gtest/gtest.h>

#include <string>

#include "common/expect_error.h"
#include "support/shapes.h"

namespace unimoe {
namespace {

using test::error_of;

std::string fixture_path(const std::string& name) {
  return std::string(UNIMOE_SOURCE_DIR) + "/tests/cpu/data/hf_configs/" + name;
}

TEST(HfConfigBench, PresetsByDefault) {
  const std::vector<Preset> shapes = bench_shapes(ShapeRequest{});
  ASSERT_EQ(shapes.size(), 1u);
  EXPECT_EQ(shapes[0].name, "qwen3-30b-a3b");
  EXPECT_EQ(shapes[0].config.experts.quant, QuantVariant::BF16);

  ShapeRequest all;
  all.presets = "all";
  all.quant = QuantVariant::FP8Block128;
  const std::vector<Preset> every = bench_shapes(all);
  EXPECT_EQ(every.size(), presets().size());
  for (const Preset& p : every) EXPECT_EQ(p.config.experts.quant, QuantVariant::FP8Block128) << p.name;

  ShapeRequest unknown;
  unknown.presets = "mixtral-8x7b,nope";
  EXPECT_EQ(error_of([&] { bench_shapes(unknown); }).field(), "preset");
}

TEST(HfConfigBench, ConfigText) {
  ShapeRequest r;
  r.config = "policy=DeepSeekV3 E=256 K=8 n_group=8 topk_group=4 scale=2.5 routing_bias=1 H=7168 I=2048 "
             "quant=FP8Block128";
  const std::vector<Preset> shapes = bench_shapes(r);
  ASSERT_EQ(shapes.size(), 1u);
  EXPECT_EQ(shapes[0].name, "config");
  EXPECT_EQ(shapes[0].config.to_string(), MoEConfig::parse(r.config).to_string());
  EXPECT_EQ(shapes[0].config.experts.quant, QuantVariant::FP8Block128);  // the text's own
  // --quant overrides it.
  r.quant = QuantVariant::BF16;
  MoEConfig want = find_preset("deepseek-v3").config;
  EXPECT_EQ(bench_shapes(r)[0].config.to_string(), want.to_string());
}

TEST(HfConfigBench, HfConfigFile) {
  ShapeRequest r;
  r.hf_config = fixture_path("deepseek-v3.json");
  const std::vector<Preset> shapes = bench_shapes(r);
  ASSERT_EQ(shapes.size(), 1u);
  EXPECT_EQ(shapes[0].name, "deepseek_v3");
  EXPECT_EQ(shapes[0].config.experts.quant, QuantVariant::FP8Block128);
  r.quant = QuantVariant::BF16;
  EXPECT_EQ(bench_shapes(r)[0].config.to_string(), find_preset("deepseek-v3").config.to_string());
}

TEST(HfConfigBench, Refusals) {
  struct Case {
    const char* what;
    ShapeRequest request;
    const char* field;
  };
  auto request = [](std::string config, std::string hf, bool presets_given) {
    ShapeRequest r;
    r.config = std::move(config);
    r.hf_config = std::move(hf);
    r.presets_given = presets_given;
    return r;
  };
  const std::string v3 = fixture_path("deepseek-v3.json");
  const Case cases[] = {
      {"both flags", request("policy=Renormalize E=8 K=2 H=64 I=64", v3, false), "config"},
      {"--config with --preset", request("policy=Renormalize E=8 K=2 H=64 I=64", "", true), "preset"},
      {"--hf-config with --preset", request("", v3, true), "preset"},
      {"a value that does not parse", request("policy=Renormalize E=eight K=2 H=64 I=64", "", false), "E"},
      {"an unknown key", request("policy=Renormalize E=8 K=2 H=64 I=64 experts=8", "", false), "config"},
      {"an unknown policy", request("policy=Softmax E=8 K=2 H=64 I=64", "", false), "routing.policy"},
      {"backend in the text", request("policy=Renormalize E=8 K=2 H=64 I=64 backend=mma", "", false), "config"},
      {"routing_variant in the text",
       request("policy=Renormalize E=8 K=2 H=64 I=64 routing_variant=split", "", false), "config"},
      {"an invalid config", request("policy=Renormalize E=8 K=9 H=64 I=64", "", false), "routing.top_k"},
      {"no such file", request("", fixture_path("no-such-model.json"), false), "hf-config"},
      {"a refused model", request("", fixture_path("deepseek-v2.json"), false), "hf_config.topk_method"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(error_of([&] { bench_shapes(c.request); }).field(), c.field);
  }
}

}  // namespace
}  // namespace unimoe
