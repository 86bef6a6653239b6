// Config printing/parsing and validation messages.
#include <gtest/gtest.h>

#include <string>

#include "unimoe/unimoe.h"

namespace unimoe {
namespace {

MoEConfig dsv3_config() {
  MoEConfig c;
  c.routing.policy = RoutingPolicy::DeepSeekV3;
  c.routing.num_experts = 256;
  c.routing.top_k = 8;
  c.routing.n_group = 8;
  c.routing.topk_group = 4;
  c.routing.routed_scaling_factor = 2.5f;
  c.routing.has_bias = true;
  c.experts.hidden = 7168;
  c.experts.intermediate = 2048;
  return c;
}

TEST(Config, PrintsAndParsesBack) {
  MoEConfig c = dsv3_config();
  c.routing.logits_type = LogitsType::BF16;
  c.experts.activation = Activation::SwiGLUOai;
  c.experts.swiglu_alpha = 1.702f;
  c.experts.swiglu_limit = 7.0f;
  c.experts.has_bias = true;
  c.experts.local_expert_offset = 32;
  c.experts.num_local_experts = 32;
  c.experts.quant = QuantVariant::FP8Block128;
  c.options.backend = "mma";
  c.options.deterministic = false;
  const std::string text = c.to_string();
  const MoEConfig back = MoEConfig::parse(text);
  EXPECT_EQ(back.to_string(), text);
  EXPECT_EQ(back.routing.policy, RoutingPolicy::DeepSeekV3);
  EXPECT_EQ(back.routing.routed_scaling_factor, 2.5f);
  EXPECT_EQ(back.experts.swiglu_alpha, 1.702f);
  EXPECT_EQ(back.experts.local_expert_offset, 32);
  EXPECT_EQ(back.experts.quant, QuantVariant::FP8Block128);
  EXPECT_EQ(back.options.backend, "mma");
  EXPECT_FALSE(back.options.deterministic);
  EXPECT_NE(text.find("policy=DeepSeekV3"), std::string::npos);
}

TEST(Config, RoutingVariantPrintsOnlyWhenForced) {
  MoEConfig c = dsv3_config();
  EXPECT_EQ(c.to_string().find("routing_variant"), std::string::npos);  // the tuning key as before
  c.options.routing_variant = "cluster";
  const std::string text = c.to_string();
  EXPECT_NE(text.find(" routing_variant=cluster"), std::string::npos);
  EXPECT_EQ(MoEConfig::parse(text).options.routing_variant, "cluster");
  validate(c);
  c.options.routing_variant = "fast";
  try {
    validate(c);
    ADD_FAILURE() << "routing_variant=fast was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "options.routing_variant");
    EXPECT_NE(std::string(e.what()).find("auto, split, fused, cluster"), std::string::npos);
  }
}

TEST(Config, FloatsRoundTripExactly) {
  MoEConfig c = dsv3_config();
  c.routing.routed_scaling_factor = 0.1f;
  EXPECT_EQ(MoEConfig::parse(c.to_string()).routing.routed_scaling_factor, 0.1f);
  c.routing.routed_scaling_factor = 1.0f / 3.0f;
  EXPECT_EQ(MoEConfig::parse(c.to_string()).routing.routed_scaling_factor, 1.0f / 3.0f);
}

TEST(Config, EveryEnumNameRoundTrips) {
  for (int i = 0; i <= static_cast<int>(RoutingPolicy::MiniMax2); ++i) {
    const auto v = static_cast<RoutingPolicy>(i);
    EXPECT_EQ(parse_routing_policy(to_string(v)), v);
  }
  for (int i = 0; i <= static_cast<int>(Activation::SwiGLUOai); ++i) {
    const auto v = static_cast<Activation>(i);
    EXPECT_EQ(parse_activation(to_string(v)), v);
  }
  for (int i = 0; i <= static_cast<int>(QuantVariant::NVFP4); ++i) {
    const auto v = static_cast<QuantVariant>(i);
    EXPECT_EQ(parse_quant_variant(to_string(v)), v);
  }
}

// The message of the Error `fn` throws, or "" when it throws none.
template <typename Fn>
std::string error_of(Fn fn, std::string* field = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (field) *field = e.field();
    return e.what();
  }
  return "";
}

TEST(Config, ParseErrorsNameTheKeyAndAllowedValues) {
  std::string field;
  std::string msg = error_of([] { MoEConfig::parse("policy=Softmax"); }, &field);
  EXPECT_EQ(field, "routing.policy");
  EXPECT_NE(msg.find("'Softmax'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("DeepSeekV3"), std::string::npos) << msg;
  msg = error_of([] { MoEConfig::parse("E=12x"); }, &field);
  EXPECT_EQ(field, "E");
  EXPECT_NE(msg.find("not an integer"), std::string::npos) << msg;
  msg = error_of([] { MoEConfig::parse("colour=red"); }, &field);
  EXPECT_NE(msg.find("unknown key 'colour'"), std::string::npos) << msg;
  msg = error_of([] { MoEConfig::parse("E"); });
  EXPECT_NE(msg.find("not key=value"), std::string::npos) << msg;
  msg = error_of([] { MoEConfig::parse("deterministic=maybe"); });
  EXPECT_NE(msg.find("not a boolean"), std::string::npos) << msg;
}

TEST(Validate, AcceptsEveryPresetLikeConfig) {
  EXPECT_NO_THROW(validate(dsv3_config()));
  MoEConfig mixtral;
  mixtral.routing = {RoutingPolicy::Renormalize, 8, 2};
  mixtral.experts.hidden = 4096;
  mixtral.experts.intermediate = 14336;
  EXPECT_NO_THROW(validate(mixtral));
  MoEConfig llama4 = mixtral;
  llama4.routing = {RoutingPolicy::Llama4, 128, 1};
  EXPECT_NO_THROW(validate(llama4));
  MoEConfig oss = mixtral;
  oss.routing = {RoutingPolicy::Renormalize, 128, 4};
  oss.experts.hidden = 2880;
  oss.experts.intermediate = 2880;
  oss.experts.activation = Activation::SwiGLUOai;
  oss.experts.has_bias = true;
  oss.experts.quant = QuantVariant::MXFP4;
  EXPECT_NO_THROW(validate(oss));
}

struct BadCase {
  const char* name;
  void (*edit)(MoEConfig&);
  const char* field;
  const char* message_part;
};

const BadCase kBadCases[] = {
    {"K>E", [](MoEConfig& c) { c.routing.num_experts = 4; c.routing.top_k = 8; c.routing.n_group = 1; c.routing.topk_group = 1; },
     "routing.top_k", "top_k must be <= num_experts"},
    {"K=0", [](MoEConfig& c) { c.routing.top_k = 0; }, "routing.top_k", "allowed: 1..32"},
    {"K>32", [](MoEConfig& c) { c.routing.top_k = 33; }, "routing.top_k", "allowed: 1..32"},
    {"E=0", [](MoEConfig& c) { c.routing.num_experts = 0; }, "routing.num_experts", "allowed: 1..1024"},
    {"E>1024", [](MoEConfig& c) { c.routing.num_experts = 2048; }, "routing.num_experts", "allowed: 1..1024"},
    {"n_group not dividing E", [](MoEConfig& c) { c.routing.n_group = 7; }, "routing.n_group", "does not divide num_experts 256"},
    {"n_group>16", [](MoEConfig& c) { c.routing.n_group = 32; }, "routing.n_group", "allowed: 1..16"},
    {"topk_group>n_group", [](MoEConfig& c) { c.routing.topk_group = 9; }, "routing.topk_group", "allowed: 1..n_group (8)"},
    {"topk_group>8", [](MoEConfig& c) { c.routing.n_group = 16; c.routing.topk_group = 9; }, "routing.topk_group", "allowed: 1..8"},
    {"K>kept experts", [](MoEConfig& c) { c.routing.num_experts = 32; c.routing.topk_group = 1; c.routing.top_k = 8; }, "routing.top_k", "kept groups hold only 4 experts"},
    {"K>22 grouped", [](MoEConfig& c) { c.routing.top_k = 23; }, "routing.top_k", "allowed with n_group > 1: 1..22"},
    {"groups of one", [](MoEConfig& c) { c.routing.num_experts = 8; c.routing.top_k = 2; }, "routing.n_group", "at least 2 experts"},
    {"groups with Renormalize", [](MoEConfig& c) { c.routing.policy = RoutingPolicy::Renormalize; c.routing.has_bias = false; }, "routing.n_group", "only for DeepSeekV3"},
    {"Llama4 K=2", [](MoEConfig& c) { c.routing = {RoutingPolicy::Llama4, 16, 2}; }, "routing.top_k", "Llama4 needs top_k = 1"},
    {"bias with Sigmoid", [](MoEConfig& c) { c.routing.policy = RoutingPolicy::Sigmoid; c.routing.n_group = 1; c.routing.topk_group = 1; }, "routing.has_bias", "only for DeepSeekV3 and MiniMax2"},
    {"scale 0", [](MoEConfig& c) { c.routing.routed_scaling_factor = 0; }, "routing.routed_scaling_factor", "finite number > 0"},
    {"H=0", [](MoEConfig& c) { c.experts.hidden = 0; }, "experts.hidden", "must be > 0"},
    {"I<0", [](MoEConfig& c) { c.experts.intermediate = -8; }, "experts.intermediate", "must be > 0"},
    {"H odd for BF16", [](MoEConfig& c) { c.experts.hidden = 7170; }, "experts.hidden", "BF16 needs a multiple of 8"},
    {"I for Block128", [](MoEConfig& c) { c.experts.quant = QuantVariant::FP8Block128; c.experts.intermediate = 2000; }, "experts.intermediate", "FP8Block128 needs a multiple of 128"},
    {"H for MXFP4", [](MoEConfig& c) { c.experts.quant = QuantVariant::MXFP4; c.experts.hidden = 7168 + 16; }, "experts.hidden", "MXFP4 needs a multiple of 32"},
    {"local offset outside", [](MoEConfig& c) { c.experts.local_expert_offset = 256; }, "experts.local_expert_offset", "allowed: 0..255"},
    {"local range outside", [](MoEConfig& c) { c.experts.local_expert_offset = 200; c.experts.num_local_experts = 64; }, "experts.num_local_experts", "lies outside the 256 experts"},
    {"local count 0", [](MoEConfig& c) { c.experts.num_local_experts = 0; }, "experts.num_local_experts", "-1 (all) or >= 1"},
    {"limit <= 0", [](MoEConfig& c) { c.experts.activation = Activation::SwiGLUOai; c.experts.swiglu_limit = -1; }, "experts.swiglu_limit", "finite number > 0"},
    {"empty backend", [](MoEConfig& c) { c.options.backend = ""; }, "options.backend", "is empty"},
};

TEST(Validate, RefusesEachImpossibleConfigWithItsField) {
  for (const BadCase& bad : kBadCases) {
    SCOPED_TRACE(bad.name);
    MoEConfig c = dsv3_config();
    bad.edit(c);
    std::string field;
    const std::string msg = error_of([&] { validate(c); }, &field);
    ASSERT_FALSE(msg.empty()) << "not refused";
    EXPECT_EQ(field, bad.field) << msg;
    EXPECT_NE(msg.find(bad.message_part), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind(bad.field, 0), 0u) << "message should start with the field: " << msg;
  }
}

TEST(Config, DerivedSizes) {
  MoEConfig c = dsv3_config();
  EXPECT_EQ(c.local_experts(), 256);
  EXPECT_EQ(c.gemm1_cols(), 4096);
  c.experts.num_local_experts = 32;
  c.experts.activation = Activation::ReLU2;
  EXPECT_EQ(c.local_experts(), 32);
  EXPECT_EQ(c.gemm1_cols(), 2048);
}

}  // namespace
}  // namespace unimoe
