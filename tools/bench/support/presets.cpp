#include "support/presets.h"

namespace unimoe {
namespace {

MoEConfig make(RoutingPolicy policy, int e, int h, int i, int k) {
  return moe_config(policy, e, k, h, i);
}

MoEConfig grouped(MoEConfig c, int n_group, int topk_group, float scale) {
  c.routing.n_group = n_group;
  c.routing.topk_group = topk_group;
  c.routing.routed_scaling_factor = scale;
  c.routing.has_bias = true;
  return c;
}

MoEConfig gpt_oss(MoEConfig c) {
  c.experts.activation = Activation::SwiGLUOai;
  c.experts.has_bias = true;
  return c;
}

std::vector<Preset> build() {
  using P = RoutingPolicy;
  return {
      {"mixtral-8x7b", "Mixtral 8x7B", make(P::Renormalize, 8, 4096, 14336, 2)},
      {"qwen3-30b-a3b", "Qwen3-30B-A3B", make(P::Renormalize, 128, 2048, 768, 8)},
      {"qwen3-235b-a22b", "Qwen3-235B-A22B", make(P::Renormalize, 128, 4096, 1536, 8)},
      {"deepseek-v3", "DeepSeek-V3/R1, whole layer on one GPU",
       grouped(make(P::DeepSeekV3, 256, 7168, 2048, 8), 8, 4, 2.5f)},
      {"dsv3-tp8", "DeepSeek-V3, intermediate split 8 ways (TP8)",
       grouped(make(P::DeepSeekV3, 256, 7168, 256, 8), 8, 4, 2.5f)},
      {"gpt-oss-120b", "gpt-oss-120b (BF16 weights)",
       gpt_oss(make(P::Renormalize, 128, 2880, 2880, 4))},
      {"kimi-k2", "Kimi-K2 (one group)", grouped(make(P::DeepSeekV3, 384, 7168, 2048, 8), 1, 1, 2.827f)},
      {"llama4-maverick", "Llama-4 Maverick routed experts", make(P::Llama4, 128, 5120, 8192, 1)},
      {"minimax-m2", "MiniMax-M2", grouped(make(P::MiniMax2, 256, 3072, 1536, 8), 1, 1, 1.0f)},
  };
}

}  // namespace

MoEConfig moe_config(RoutingPolicy policy, int num_experts, int top_k, int hidden,
                     int intermediate) {
  MoEConfig c;
  c.routing.policy = policy;
  c.routing.num_experts = num_experts;
  c.routing.top_k = top_k;
  c.experts.hidden = hidden;
  c.experts.intermediate = intermediate;
  return c;
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = build();
  return all;
}

const Preset& find_preset(const std::string& name) {
  std::string known;
  for (const Preset& p : presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw Error("preset", "unknown preset '" + name + "'; known: " + known);
}

}  // namespace unimoe
