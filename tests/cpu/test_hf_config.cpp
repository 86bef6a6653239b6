// config_from_hf_json over one published config.json per model family
// (tests/cpu/data/hf_configs/): every mapped field, agreement with the
// benchmark's presets of the same models, transformers' defaults for keys
// left out, and each refusal's field.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "common/expect_error.h"
#include "support/presets.h"
#include "unimoe/hf_config.h"

namespace unimoe {
namespace {

using test::error_of;

std::string fixture_path(const std::string& name) {
  return std::string(UNIMOE_SOURCE_DIR) + "/tests/cpu/data/hf_configs/" + name;
}

std::string fixture(const std::string& name) {
  std::ifstream in(fixture_path(name));
  EXPECT_TRUE(in) << "cannot read " << fixture_path(name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

MoEConfig from_fixture(const std::string& name) { return config_from_hf_json(fixture(name)); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every field of `c` (to_string prints them all) against a config's text,
// keys left out at their defaults.
void expect_config(const MoEConfig& c, const std::string& want) {
  EXPECT_EQ(c.to_string(), MoEConfig::parse(want).to_string());
  EXPECT_NO_THROW(validate(c));
}

// The same config as a preset's, the quant variant aside (presets are BF16).
void expect_same_as_preset(MoEConfig c, const std::string& preset) {
  c.experts.quant = QuantVariant::BF16;
  EXPECT_EQ(c.to_string(), find_preset(preset).config.to_string());
}

struct Published {
  const char* file;
  const char* want;    // the MoEConfig, as text
  const char* preset;  // the benchmark's preset of the same model, or ""
};

const Published kPublished[] = {
    {"mixtral-8x7b.json", "policy=Renormalize E=8 K=2 H=4096 I=14336", "mixtral-8x7b"},
    // norm_topk_prob false: the softmax over all 60 experts, not
    // renormalized. I is moe_intermediate_size, not intermediate_size (5632,
    // the shared expert's width).
    {"qwen1.5-moe-a2.7b.json", "policy=Default E=60 K=4 H=2048 I=1408", ""},
    {"qwen3-30b-a3b.json", "policy=Renormalize E=128 K=8 H=2048 I=768", "qwen3-30b-a3b"},
    // Greedy softmax top-k, not renormalized, scale 1.
    {"deepseek-v2-lite.json", "policy=Default E=64 K=6 H=2048 I=1408", ""},
    {"deepseek-v3.json",
     "policy=DeepSeekV3 E=256 K=8 n_group=8 topk_group=4 scale=2.5 routing_bias=1 H=7168 I=2048 "
     "quant=FP8Block128",
     "deepseek-v3"},
    {"kimi-k2-instruct.json",
     "policy=DeepSeekV3 E=384 K=8 n_group=1 topk_group=1 scale=2.827 routing_bias=1 H=7168 I=2048 "
     "quant=FP8Block128",
     "kimi-k2"},
    {"gpt-oss-120b.json",
     "policy=Renormalize E=128 K=4 H=2880 I=2880 act=SwiGLUOai alpha=1.702 limit=7 expert_bias=1 "
     "quant=MXFP4",
     "gpt-oss-120b"},
    {"minimax-m2.json", "policy=MiniMax2 E=256 K=8 routing_bias=1 H=3072 I=1536 quant=FP8Block128",
     "minimax-m2"},
};

TEST(HfConfig, PublishedConfigs) {
  for (const Published& p : kPublished) {
    SCOPED_TRACE(p.file);
    const MoEConfig c = from_fixture(p.file);
    expect_config(c, p.want);
    if (*p.preset != '\0') expect_same_as_preset(c, p.preset);
  }
}

TEST(HfConfig, SpelledOutForDeepSeekV3) {
  const MoEConfig c = from_fixture("deepseek-v3.json");
  EXPECT_EQ(c.routing.policy, RoutingPolicy::DeepSeekV3);
  EXPECT_EQ(c.routing.num_experts, 256);
  EXPECT_EQ(c.routing.top_k, 8);
  EXPECT_EQ(c.routing.n_group, 8);
  EXPECT_EQ(c.routing.topk_group, 4);
  EXPECT_EQ(c.routing.routed_scaling_factor, 2.5f);
  EXPECT_TRUE(c.routing.has_bias);
  EXPECT_EQ(c.routing.logits_type, LogitsType::F32);
  EXPECT_EQ(c.experts.hidden, 7168);
  EXPECT_EQ(c.experts.intermediate, 2048);
  EXPECT_EQ(c.experts.activation, Activation::SwiGLU);
  EXPECT_FALSE(c.experts.has_bias);
  EXPECT_EQ(c.experts.num_local_experts, -1);
  EXPECT_EQ(c.experts.quant, QuantVariant::FP8Block128);
  EXPECT_EQ(c.options.backend, "auto");
}

TEST(HfConfig, KimiK2UnderModelTypeDeepSeekV3) {
  std::string as_v3 = fixture("kimi-k2-instruct.json");
  as_v3.replace(as_v3.find("\"kimi_k2\""), 9, "\"deepseek_v3\"");
  EXPECT_EQ(config_from_hf_json(as_v3).to_string(), from_fixture("kimi-k2-instruct.json").to_string());
}

TEST(HfConfig, GptOssReadsAlphaAndLimit) {
  // gpt-oss's experts apply their own activation, whatever hidden_act says.
  expect_config(config_from_hf_json(R"({"model_type": "gpt_oss", "swiglu_alpha": 1.5, "swiglu_limit": 5,
                                        "hidden_act": "gelu"})"),
                "policy=Renormalize E=128 K=4 H=2880 I=2880 act=SwiGLUOai alpha=1.5 limit=5 expert_bias=1");
}

TEST(HfConfig, MiniMaxM2WithoutRoutingBias) {
  expect_config(config_from_hf_json(R"({"model_type": "minimax_m2", "use_routing_bias": false})"),
                "policy=MiniMax2 E=256 K=8 H=3072 I=1536");
}

TEST(HfConfig, MiniMaxTextIsMixtralsRouter) {
  expect_config(config_from_hf_json(R"({"model_type": "minimax", "num_local_experts": 32,
                                        "num_experts_per_tok": 2, "hidden_size": 6144,
                                        "intermediate_size": 9216})"),
                "policy=Renormalize E=32 K=2 H=6144 I=9216");
}

TEST(HfConfig, KeysLeftOutTakeTransformersDefaults) {
  expect_same_as_preset(config_from_hf_json(R"({"model_type": "deepseek_v3"})"), "deepseek-v3");
  expect_same_as_preset(config_from_hf_json(R"({"model_type": "mixtral"})"), "mixtral-8x7b");
  expect_same_as_preset(config_from_hf_json(R"({"model_type": "gpt_oss"})"), "gpt-oss-120b");
  expect_same_as_preset(config_from_hf_json(R"({"model_type": "minimax_m2"})"), "minimax-m2");
  // norm_topk_prob defaults to false.
  expect_config(config_from_hf_json(R"({"model_type": "qwen3_moe"})"), "policy=Default E=128 K=8 H=2048 I=768");
  expect_config(config_from_hf_json(R"({"model_type": "qwen2_moe"})"), "policy=Default E=60 K=4 H=2048 I=1408");
  // transformers 5 saves Qwen-MoE's num_experts as num_local_experts.
  EXPECT_EQ(config_from_hf_json(R"({"model_type": "qwen3_moe", "num_local_experts": 64})")
                .routing.num_experts,
            64);
  // A null value is the default too, as transformers' None is.
  EXPECT_EQ(config_from_hf_json(R"({"model_type": "mixtral", "hidden_size": null})").experts.hidden, 4096);
}

TEST(HfConfig, ActivationsAndQuantization) {
  EXPECT_EQ(config_from_hf_json(R"({"model_type": "mixtral", "hidden_act": "gelu"})").experts.activation,
            Activation::GeGLU);
  const MoEConfig per_tensor = config_from_hf_json(
      R"({"model_type": "qwen3_moe", "quantization_config":
          {"quant_method": "fp8", "activation_scheme": "static"}})");
  EXPECT_EQ(per_tensor.experts.quant, QuantVariant::FP8PerTensor);
  const MoEConfig dynamic = config_from_hf_json(
      R"({"model_type": "qwen3_moe", "quantization_config": {"quant_method": "fp8", "weight_block_size": null}})");
  EXPECT_EQ(dynamic.experts.quant, QuantVariant::FP8PerTensor);
}

TEST(HfConfig, GroupLimitedGreedyKeepingEveryGroupIsGreedy) {
  expect_config(config_from_hf_json(R"({"model_type": "deepseek_v2", "topk_method": "group_limited_greedy",
                                        "n_group": 4, "topk_group": 4, "num_experts_per_tok": 6,
                                        "moe_intermediate_size": 1408})"),
                "policy=Default E=64 K=6 H=4096 I=1408");
}

// ------------------------------------------------------------- refusals ----

struct Refusal {
  const char* what;
  std::string json;
  const char* field;
  const char* message_part;
};

TEST(HfConfig, RefusalsNameTheKey) {
  const Refusal cases[] = {
      {"bad JSON", R"({"model_type": "mixtral",)", "hf_config", "not valid JSON"},
      {"not an object", R"([1, 2])", "hf_config", "not a JSON object"},
      {"no model_type", R"({"hidden_size": 4096})", "hf_config.model_type", "missing"},
      {"unknown model_type", R"({"model_type": "llama"})", "hf_config.model_type", "supported: mixtral"},
      {"model_type not a string", R"({"model_type": 3})", "hf_config.model_type", "expected a string"},
      {"integer as a string", R"({"model_type": "mixtral", "num_local_experts": "8"})",
       "hf_config.num_local_experts", "expected an integer"},
      {"integer as a float", R"({"model_type": "mixtral", "hidden_size": 4096.5})", "hf_config.hidden_size",
       "expected an integer"},
      {"integer out of range", R"({"model_type": "mixtral", "hidden_size": 4294967296})",
       "hf_config.hidden_size", "range"},
      {"both names of E, differing", R"({"model_type": "qwen3_moe", "num_experts": 128, "num_local_experts": 64})",
       "hf_config.num_local_experts", "name one field"},
      {"boolean as a number", R"({"model_type": "qwen3_moe", "norm_topk_prob": 1})",
       "hf_config.norm_topk_prob", "true or false"},
      {"number as a string", R"({"model_type": "deepseek_v3", "routed_scaling_factor": "2.5"})",
       "hf_config.routed_scaling_factor", "expected a number"},
      {"DeepSeek-V2 without top_k", R"({"model_type": "deepseek_v2"})", "hf_config.num_experts_per_tok",
       "missing"},
      {"DeepSeek-V2's group-limited greedy", fixture("deepseek-v2.json"), "hf_config.topk_method",
       "no unimoe policy"},
      {"DeepSeek-V2 scaled", R"({"model_type": "deepseek_v2", "num_experts_per_tok": 6, "routed_scaling_factor": 16.0})",
       "hf_config.routed_scaling_factor", "Default has no scale"},
      {"DeepSeek-V2 renormalized", R"({"model_type": "deepseek_v2", "num_experts_per_tok": 6, "norm_topk_prob": true})",
       "hf_config.norm_topk_prob", "not established"},
      {"DeepSeek-V2 sigmoid", R"({"model_type": "deepseek_v2", "num_experts_per_tok": 6, "scoring_func": "sigmoid"})",
       "hf_config.scoring_func", "softmax"},
      {"DeepSeek-V3 not renormalized", R"({"model_type": "deepseek_v3", "norm_topk_prob": false})",
       "hf_config.norm_topk_prob", "without renormalization"},
      {"DeepSeek-V3 softmax", R"({"model_type": "deepseek_v3", "scoring_func": "softmax"})",
       "hf_config.scoring_func", "sigmoid"},
      {"DeepSeek-V3 greedy", R"({"model_type": "deepseek_v3", "topk_method": "greedy"})",
       "hf_config.topk_method", "noaux_tc"},
      {"MiniMax-M2 under model_type minimax", R"({"model_type": "minimax", "scoring_func": "sigmoid"})",
       "hf_config.scoring_func", "minimax_m2"},
      {"MiniMax bias under model_type minimax", R"({"model_type": "minimax", "use_routing_bias": true})",
       "hf_config.use_routing_bias", "minimax_m2"},
      {"MiniMax-M2 scaled", R"({"model_type": "minimax_m2", "routed_scaling_factor": 2.0})",
       "hf_config.routed_scaling_factor", "no scale"},
      {"tanh gelu", R"({"model_type": "qwen3_moe", "hidden_act": "gelu_pytorch_tanh"})", "hf_config.hidden_act",
       "tanh"},
      {"int4 checkpoint", R"({"model_type": "kimi_k2", "quantization_config": {"quant_method": "compressed-tensors"}})",
       "hf_config.quantization_config.quant_method", "compressed-tensors"},
      {"no quant_method", R"({"model_type": "mixtral", "quantization_config": {"bits": 4}})",
       "hf_config.quantization_config.quant_method", "missing"},
      {"quantization_config not an object", R"({"model_type": "mixtral", "quantization_config": "fp8"})",
       "hf_config.quantization_config", "JSON object"},
      {"other FP8 blocks",
       R"({"model_type": "deepseek_v3", "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 64]}})",
       "hf_config.quantization_config.weight_block_size", "128x128"},
      {"e5m2", R"({"model_type": "deepseek_v3", "quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}})",
       "hf_config.quantization_config.fmt", "e4m3"},
      {"static scales with blocks",
       R"({"model_type": "deepseek_v3", "quantization_config": {"quant_method": "fp8", "activation_scheme": "static",
           "weight_block_size": [128, 128]}})",
       "hf_config.quantization_config.activation_scheme", "per token"},
      {"a shape validate() refuses", R"({"model_type": "qwen2_moe", "moe_intermediate_size": 1407})",
       "experts.intermediate", "multiple of 8"},
      {"K above E", R"({"model_type": "mixtral", "num_experts_per_tok": 9})", "routing.top_k", "num_experts"},
  };
  for (const Refusal& r : cases) {
    SCOPED_TRACE(r.what);
    const Error e = error_of([&] { config_from_hf_json(r.json); });
    EXPECT_EQ(e.field(), r.field);
    EXPECT_TRUE(contains(e.what(), r.message_part)) << e.what();
  }
}

TEST(HfConfig, Llama4IsRefusedWithItsShape) {
  // The routed expert's width is intermediate_size (8192), not
  // intermediate_size_mlp (16384, the dense layers').
  const Error scout = error_of([] { from_fixture("llama4-scout-17b-16e.json"); });
  EXPECT_EQ(scout.field(), "hf_config.model_type");
  EXPECT_TRUE(contains(scout.what(), "expert(sigmoid(x) * h)")) << scout.what();
  EXPECT_TRUE(contains(scout.what(), "policy=Llama4 E=16 K=1 H=5120 I=8192")) << scout.what();
  const Error maverick = error_of([] { from_fixture("llama4-maverick-17b-128e.json"); });
  EXPECT_EQ(maverick.field(), "hf_config.model_type");
  EXPECT_TRUE(contains(maverick.what(), "policy=Llama4 E=128 K=1 H=5120 I=8192")) << maverick.what();
  // A bare text config, and a text_config of the wrong type.
  const Error text = error_of([] { config_from_hf_json(R"({"model_type": "llama4_text"})"); });
  EXPECT_TRUE(contains(text.what(), "policy=Llama4 E=16 K=1 H=5120 I=8192")) << text.what();
  const Error nested = error_of([] {
    config_from_hf_json(R"({"model_type": "llama4", "text_config": {"num_local_experts": "16"}})");
  });
  EXPECT_EQ(nested.field(), "hf_config.text_config.num_local_experts");
}

}  // namespace
}  // namespace unimoe
