// Config validation: every impossible setting is refused before any work,
// with the field and the allowed values in the message. One rule a block;
// the comment above each says why the rule exists.
#include <cmath>
#include <string>

#include "unimoe/unimoe.h"

namespace unimoe {
namespace {

constexpr int kMaxExperts = 1024;
constexpr int kMaxTopK = 32;
constexpr int kMaxTopKGrouped = 22;
constexpr int kMaxGroups = 16;
constexpr int kMaxTopKGroup = 8;

void require(bool ok, const char* field, const std::string& message) {
  if (!ok) throw Error(field, message);
}

std::string str(int v) { return std::to_string(v); }

bool uses_groups(RoutingPolicy p) { return p == RoutingPolicy::DeepSeekV3; }
bool uses_bias(RoutingPolicy p) {
  return p == RoutingPolicy::DeepSeekV3 || p == RoutingPolicy::MiniMax2;
}

void validate_routing(const RoutingConfig& r) {
  const int e = r.num_experts, k = r.top_k;
  require(e >= 1 && e <= kMaxExperts, "routing.num_experts",
          "is " + str(e) + "; allowed: 1.." + str(kMaxExperts));
  require(k >= 1 && k <= kMaxTopK, "routing.top_k", "is " + str(k) + "; allowed: 1.." + str(kMaxTopK));
  require(k <= e, "routing.top_k", "is " + str(k) + " but num_experts is " + str(e) + "; top_k must be <= num_experts");
  // Llama4 routes each token to exactly one expert.
  require(r.policy != RoutingPolicy::Llama4 || k == 1, "routing.top_k",
          "is " + str(k) + "; policy Llama4 needs top_k = 1");
  require(r.n_group >= 1 && r.n_group <= kMaxGroups, "routing.n_group",
          "is " + str(r.n_group) + "; allowed: 1.." + str(kMaxGroups));
  require(r.topk_group >= 1 && r.topk_group <= r.n_group, "routing.topk_group",
          "is " + str(r.topk_group) + "; allowed: 1..n_group (" + str(r.n_group) + ")");
  require(r.topk_group <= kMaxTopKGroup, "routing.topk_group",
          "is " + str(r.topk_group) + "; allowed: 1.." + str(kMaxTopKGroup));
  // Only DeepSeekV3 scores groups; MiniMax2 is DeepSeekV3 with one group.
  require(uses_groups(r.policy) || (r.n_group == 1 && r.topk_group == 1), "routing.n_group",
          "is " + str(r.n_group) + " with policy " + to_string(r.policy) +
              "; groups (n_group > 1) are only for DeepSeekV3");
  if (r.n_group > 1) {
    const int per_group = e / r.n_group;
    require(e % r.n_group == 0, "routing.n_group",
            "is " + str(r.n_group) + ", which does not divide num_experts " + str(e));
    // A group is scored by the sum of its two best experts.
    require(per_group >= 2, "routing.n_group",
            "is " + str(r.n_group) + ": groups need at least 2 experts each (num_experts " + str(e) + ")");
    require(k <= kMaxTopKGrouped, "routing.top_k",
            "is " + str(k) + "; allowed with n_group > 1: 1.." + str(kMaxTopKGrouped));
    require(k <= r.topk_group * per_group, "routing.top_k",
            "is " + str(k) + " but the " + str(r.topk_group) + " kept groups hold only " +
                str(r.topk_group * per_group) + " experts");
  }
  require(uses_bias(r.policy) || !r.has_bias, "routing.has_bias",
          "is set with policy " + to_string(r.policy) + "; a score bias is only for DeepSeekV3 and MiniMax2");
  require(std::isfinite(r.routed_scaling_factor) && r.routed_scaling_factor > 0,
          "routing.routed_scaling_factor", "must be a finite number > 0");
}

void validate_experts(const ExpertsConfig& x, int num_experts) {
  const int hm = hidden_multiple(x.quant), im = intermediate_multiple(x.quant);
  require(x.hidden > 0, "experts.hidden", "is " + str(x.hidden) + "; must be > 0");
  require(x.intermediate > 0, "experts.intermediate", "is " + str(x.intermediate) + "; must be > 0");
  // Vector loads, TMA strides and quant blocks need these multiples.
  require(x.hidden % hm == 0, "experts.hidden",
          "is " + str(x.hidden) + "; quant " + to_string(x.quant) + " needs a multiple of " + str(hm));
  require(x.intermediate % im == 0, "experts.intermediate",
          "is " + str(x.intermediate) + "; quant " + to_string(x.quant) + " needs a multiple of " + str(im));
  require(x.local_expert_offset >= 0 && x.local_expert_offset < num_experts,
          "experts.local_expert_offset",
          "is " + str(x.local_expert_offset) + "; allowed: 0.." + str(num_experts - 1));
  const int count = x.num_local_experts < 0 ? num_experts : x.num_local_experts;
  require(x.num_local_experts == -1 || x.num_local_experts >= 1, "experts.num_local_experts",
          "is " + str(x.num_local_experts) + "; allowed: -1 (all) or >= 1");
  require(x.local_expert_offset + count <= num_experts, "experts.num_local_experts",
          "range [" + str(x.local_expert_offset) + ", " + str(x.local_expert_offset + count) +
              ") lies outside the " + str(num_experts) + " experts");
  if (x.activation == Activation::SwiGLUOai) {
    require(std::isfinite(x.swiglu_alpha), "experts.swiglu_alpha", "must be finite");
    require(std::isfinite(x.swiglu_limit) && x.swiglu_limit > 0, "experts.swiglu_limit",
            "must be a finite number > 0");
  }
}

}  // namespace

int hidden_multiple(QuantVariant q) {
  switch (q) {
    case QuantVariant::BF16: return 8;
    case QuantVariant::FP8PerTensor: return 16;
    case QuantVariant::FP8Block128: return 128;
    case QuantVariant::MXFP4: return 32;
    case QuantVariant::NVFP4: return 16;
  }
  return 1;
}

int intermediate_multiple(QuantVariant q) { return hidden_multiple(q); }

void validate(const MoEConfig& c) {
  validate_routing(c.routing);
  validate_experts(c.experts, c.routing.num_experts);
  require(!c.options.backend.empty(), "options.backend", "is empty; use \"auto\" or a backend name");
  const std::string& v = c.options.routing_variant;
  require(v == "auto" || v == "split" || v == "fused" || v == "cluster", "options.routing_variant",
          "is '" + v + "'; allowed: auto, split, fused, cluster");
}

}  // namespace unimoe
