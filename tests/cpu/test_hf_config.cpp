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

// What every mapping leaves at MoEConfig's defaults.
void expect_defaults_elsewhere(const MoEConfig& c) {
  const MoEConfig d;
  EXPECT_EQ(c.routing.logits_type, LogitsType::F32);
  EXPECT_EQ(c.experts.local_expert_offset, 0);
  EXPECT_EQ(c.experts.num_local_experts, -1);
  EXPECT_EQ(c.options.backend, d.options.backend);
  EXPECT_EQ(c.options.deterministic, d.options.deterministic);
  EXPECT_EQ(c.options.routing_variant, d.options.routing_variant);
  EXPECT_NO_THROW(validate(c));
}

// The routing fields of a policy without groups, bias or scale.
void expect_plain_routing(const MoEConfig& c, RoutingPolicy policy, int e, int k) {
  EXPECT_EQ(c.routing.policy, policy);
  EXPECT_EQ(c.routing.num_experts, e);
  EXPECT_EQ(c.routing.top_k, k);
  EXPECT_EQ(c.routing.n_group, 1);
  EXPECT_EQ(c.routing.topk_group, 1);
  EXPECT_EQ(c.routing.routed_scaling_factor, 1.0f);
  EXPECT_FALSE(c.routing.has_bias);
}

void expect_experts(const MoEConfig& c, int h, int i, Activation act, bool bias, QuantVariant q) {
  EXPECT_EQ(c.experts.hidden, h);
  EXPECT_EQ(c.experts.intermediate, i);
  EXPECT_EQ(c.experts.activation, act);
  EXPECT_EQ(c.experts.has_bias, bias);
  EXPECT_EQ(c.experts.quant, q);
}

// The same config as a preset's, the quant variant aside (presets are BF16).
void expect_same_as_preset(MoEConfig c, const std::string& preset) {
  c.experts.quant = QuantVariant::BF16;
  EXPECT_EQ(c.to_string(), find_preset(preset).config.to_string());
}

TEST(HfConfig, Mixtral8x7B) {
  const MoEConfig c = from_fixture("mixtral-8x7b.json");
  expect_plain_routing(c, RoutingPolicy::Renormalize, 8, 2);
  expect_experts(c, 4096, 14336, Activation::SwiGLU, false, QuantVariant::BF16);
  expect_defaults_elsewhere(c);
  expect_same_as_preset(c, "mixtral-8x7b");
}

TEST(HfConfig, Qwen15MoeWithoutRenormalization) {
  // norm_topk_prob false: the softmax over all 60 experts, not renormalized.
  const MoEConfig c = from_fixture("qwen1.5-moe-a2.7b.json");
  expect_plain_routing(c, RoutingPolicy::Default, 60, 4);
  // moe_intermediate_size, not intermediate_size (5632, the dense and shared width).
  expect_experts(c, 2048, 1408, Activation::SwiGLU, false, QuantVariant::BF16);
  expect_defaults_elsewhere(c);
}

TEST(HfConfig, Qwen3MoeRenormalized) {
  const MoEConfig c = from_fixture("qwen3-30b-a3b.json");
  expect_plain_routing(c, RoutingPolicy::Renormalize, 128, 8);
  expect_experts(c, 2048, 768, Activation::SwiGLU, false, QuantVariant::BF16);
  expect_defaults_elsewhere(c);
  expect_same_as_preset(c, "qwen3-30b-a3b");
}

TEST(HfConfig, DeepSeekV2LiteIsDefault) {
  // Greedy softmax top-k, no renormalization, scale 1.
  const MoEConfig c = from_fixture("deepseek-v2-lite.json");
  expect_plain_routing(c, RoutingPolicy::Default, 64, 6);
  expect_experts(c, 2048, 1408, Activation::SwiGLU, false, QuantVariant::BF16);
  expect_defaults_elsewhere(c);
}

TEST(HfConfig, DeepSeekV3) {
  const MoEConfig c = from_fixture("deepseek-v3.json");
  EXPECT_EQ(c.routing.policy, RoutingPolicy::DeepSeekV3);
  EXPECT_EQ(c.routing.num_experts, 256);
  EXPECT_EQ(c.routing.top_k, 8);
  EXPECT_EQ(c.routing.n_group, 8);
  EXPECT_EQ(c.routing.topk_group, 4);
  EXPECT_EQ(c.routing.routed_scaling_factor, 2.5f);
  EXPECT_TRUE(c.routing.has_bias);
  expect_experts(c, 7168, 2048, Activation::SwiGLU, false, QuantVariant::FP8Block128);
  expect_defaults_elsewhere(c);
  expect_same_as_preset(c, "deepseek-v3");
}

TEST(HfConfig, KimiK2IsDeepSeekV3WithOneGroup) {
  const MoEConfig c = from_fixture("kimi-k2-instruct.json");
  EXPECT_EQ(c.routing.policy, RoutingPolicy::DeepSeekV3);
  EXPECT_EQ(c.routing.num_experts, 384);
  EXPECT_EQ(c.routing.top_k, 8);
  EXPECT_EQ(c.routing.n_group, 1);
  EXPECT_EQ(c.routing.topk_group, 1);
  EXPECT_EQ(c.routing.routed_scaling_factor, 2.827f);
  EXPECT_TRUE(c.routing.has_bias);
  expect_experts(c, 7168, 2048, Activation::SwiGLU, false, QuantVariant::FP8Block128);
  expect_defaults_elsewhere(c);
  expect_same_as_preset(c, "kimi-k2");
  // Kimi-K2 also ships with model_type deepseek_v3 and the same fields.
  std::string as_v3 = fixture("kimi-k2-instruct.json");
  as_v3.replace(as_v3.find("\"kimi_k2\""), 9, "\"deepseek_v3\"");
  EXPECT_EQ(config_from_hf_json(as_v3).to_string(), c.to_string());
}

TEST(HfConfig, GptOss120B) {
  const MoEConfig c = from_fixture("gpt-oss-120b.json");
  expect_plain_routing(c, RoutingPolicy::Renormalize, 128, 4);
  expect_experts(c, 2880, 2880, Activation::SwiGLUOai, true, QuantVariant::MXFP4);
  EXPECT_EQ(c.experts.swiglu_alpha, 1.702f);
  EXPECT_EQ(c.experts.swiglu_limit, 7.0f);
  expect_defaults_elsewhere(c);
  expect_same_as_preset(c, "gpt-oss-120b");
}

TEST(HfConfig, GptOssReadsAlphaAndLimit) {
  const MoEConfig c = config_from_hf_json(
      R"({"model_type": "gpt_oss", "swiglu_alpha": 1.5, "swiglu_limit": 5, "hidden_act": "gelu"})");
  EXPECT_EQ(c.experts.swiglu_alpha, 1.5f);
  EXPECT_EQ(c.experts.swiglu_limit, 5.0f);
  // gpt-oss's experts apply their own activation, whatever hidden_act says.
  EXPECT_EQ(c.experts.activation, Activation::SwiGLUOai);
  EXPECT_EQ(c.experts.quant, QuantVariant::BF16);
}

TEST(HfConfig, MiniMaxM2) {
  const MoEConfig c = from_fixture("minimax-m2.json");
  EXPECT_EQ(c.routing.policy, RoutingPolicy::MiniMax2);
  EXPECT_EQ(c.routing.num_experts, 256);
  EXPECT_EQ(c.routing.top_k, 8);
  EXPECT_EQ(c.routing.n_group, 1);
  EXPECT_EQ(c.routing.topk_group, 1);
  EXPECT_EQ(c.routing.routed_scaling_factor, 1.0f);
  EXPECT_TRUE(c.routing.has_bias);
  expect_experts(c, 3072, 1536, Activation::SwiGLU, false, QuantVariant::FP8Block128);
  expect_defaults_elsewhere(c);
  expect_same_as_preset(c, "minimax-m2");
  EXPECT_FALSE(config_from_hf_json(R"({"model_type": "minimax_m2", "use_routing_bias": false})")
                   .routing.has_bias);
}

TEST(HfConfig, MiniMaxTextIsMixtralsRouter) {
  const MoEConfig c = config_from_hf_json(
      R"({"model_type": "minimax", "num_local_experts": 32, "num_experts_per_tok": 2,
          "hidden_size": 6144, "intermediate_size": 9216})");
  expect_plain_routing(c, RoutingPolicy::Renormalize, 32, 2);
  expect_experts(c, 6144, 9216, Activation::SwiGLU, false, QuantVariant::BF16);
}

TEST(HfConfig, KeysLeftOutTakeTransformersDefaults) {
  const MoEConfig v3 = config_from_hf_json(R"({"model_type": "deepseek_v3"})");
  EXPECT_EQ(v3.to_string(), find_preset("deepseek-v3").config.to_string());
  const MoEConfig mixtral = config_from_hf_json(R"({"model_type": "mixtral"})");
  EXPECT_EQ(mixtral.to_string(), find_preset("mixtral-8x7b").config.to_string());
  const MoEConfig qwen3 = config_from_hf_json(R"({"model_type": "qwen3_moe"})");
  expect_plain_routing(qwen3, RoutingPolicy::Default, 128, 8);  // norm_topk_prob defaults to false
  expect_experts(qwen3, 2048, 768, Activation::SwiGLU, false, QuantVariant::BF16);
  const MoEConfig qwen2 = config_from_hf_json(R"({"model_type": "qwen2_moe"})");
  expect_plain_routing(qwen2, RoutingPolicy::Default, 60, 4);
  // A null value is the default too, as transformers' None is.
  EXPECT_EQ(config_from_hf_json(R"({"model_type": "mixtral", "hidden_size": null})").experts.hidden,
            4096);
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
  const MoEConfig c = config_from_hf_json(
      R"({"model_type": "deepseek_v2", "topk_method": "group_limited_greedy", "n_group": 4,
          "topk_group": 4, "num_experts_per_tok": 6})");
  expect_plain_routing(c, RoutingPolicy::Default, 64, 6);
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
