// config_from_hf_json: a Hugging Face config.json -> the MoEConfig of its
// routed experts. One mapping function per model family, each reading the
// keys that family's transformers config class defines, with that class's
// defaults; the routers behind each choice of policy: docs/hf-configs.md.
#include "unimoe/hf_config.h"

#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

namespace unimoe {
namespace {

using Json = nlohmann::json;

// A JSON value as the file writes it, for messages.
std::string shown(const Json& v) { return v.dump(); }

// One JSON object and where it sits ("" at the top, "text_config." for
// Llama-4's text model): typed reads that name the key on failure. A key
// that is absent or null takes the default given, as transformers' config
// classes do; without a default it is missing.
class Fields {
 public:
  Fields(const Json& object, std::string prefix) : object_(object), prefix_(std::move(prefix)) {}

  bool has(const char* key) const {
    const auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }

  std::string field(const char* key) const { return "hf_config." + prefix_ + key; }

  [[noreturn]] void refuse(const char* key, const std::string& why) const {
    throw Error(field(key), why);
  }

  int integer(const char* key) const {
    const Json& v = required(key);
    if (!v.is_number_integer()) refuse(key, "is " + shown(v) + "; expected an integer");
    constexpr long long kMin = std::numeric_limits<int>::min(), kMax = std::numeric_limits<int>::max();
    const bool fits = v.is_number_unsigned() ? v.get<unsigned long long>() <= static_cast<unsigned long long>(kMax)
                                             : v.get<long long>() >= kMin && v.get<long long>() <= kMax;
    if (!fits) refuse(key, "is " + shown(v) + ", outside the range of an int");
    return static_cast<int>(v.get<long long>());
  }
  int integer(const char* key, int fallback) const { return has(key) ? integer(key) : fallback; }
  // A key transformers also writes under another name (`alias`, its
  // attribute_map's): either may be present; both must then agree.
  int integer(const char* key, const char* alias, int fallback) const {
    if (has(key) && has(alias) && integer(key) != integer(alias))
      refuse(alias, "is " + std::to_string(integer(alias)) + " but " + key + " is " +
                        std::to_string(integer(key)) + "; the two name one field");
    return has(key) ? integer(key) : integer(alias, fallback);
  }

  float number(const char* key, float fallback) const {
    if (!has(key)) return fallback;
    const Json& v = object_.at(key);
    if (!v.is_number()) refuse(key, "is " + shown(v) + "; expected a number");
    return static_cast<float>(v.get<double>());
  }

  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const Json& v = object_.at(key);
    if (!v.is_boolean()) refuse(key, "is " + shown(v) + "; expected true or false");
    return v.get<bool>();
  }

  std::string text(const char* key) const {
    const Json& v = required(key);
    if (!v.is_string()) refuse(key, "is " + shown(v) + "; expected a string");
    return v.get<std::string>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    return has(key) ? text(key) : fallback;
  }

  // The object under `key`: nullptr when absent or null.
  const Json* object(const char* key) const {
    if (!has(key)) return nullptr;
    const Json& v = object_.at(key);
    if (!v.is_object()) refuse(key, "is " + shown(v) + "; expected a JSON object");
    return &v;
  }

  const Json& at(const char* key) const { return required(key); }

  // A string key that may be absent, but when present must be `want`:
  // transformers' class for the family does not read it, the model's own
  // code does, and another value would mean another router.
  void expect_text_if_present(const char* key, const std::string& want, const std::string& why) const {
    if (has(key) && text(key) != want) refuse(key, "is '" + text(key) + "'; " + why);
  }

 private:
  const Json& required(const char* key) const {
    if (!has(key)) refuse(key, "is missing, and transformers has no default for it");
    return object_.at(key);
  }

  const Json& object_;
  std::string prefix_;
};

MoEConfig base(RoutingPolicy policy, int num_experts, int top_k, int hidden, int intermediate) {
  MoEConfig c;
  c.routing = {policy, num_experts, top_k};
  c.experts.hidden = hidden;
  c.experts.intermediate = intermediate;
  return c;
}

// hidden_act of the gated experts (transformers' ACT2FN names).
Activation gated_activation(const Fields& f) {
  const std::string act = f.text("hidden_act", "silu");  // every family here defaults to silu
  if (act == "silu" || act == "swish") return Activation::SwiGLU;
  if (act == "gelu") return Activation::GeGLU;  // ACT2FN's "gelu" is the erf form
  f.refuse("hidden_act", "is '" + act +
                             "'; unimoe's gated activations are silu (SwiGLU) and the erf form of "
                             "gelu (GeGLU); tanh approximations and others are not computed");
}

// quantization_config -> the quant variant of the experts' weights.
QuantVariant quant_of(const Fields& top) {
  const Json* object = top.object("quantization_config");
  if (object == nullptr) return QuantVariant::BF16;
  const Fields q(*object, "quantization_config.");
  const std::string method = q.text("quant_method");
  if (method == "mxfp4") return QuantVariant::MXFP4;
  if (method != "fp8")
    q.refuse("quant_method", "is '" + method +
                                 "'; unimoe reads fp8 (per tensor, or 128x128 weight blocks) and "
                                 "mxfp4; set --quant (or ExpertsConfig::quant) yourself for another "
                                 "format only where its arithmetic is one of unimoe's variants");
  const std::string fmt = q.text("fmt", "e4m3");
  if (fmt != "e4m3" && fmt != "float8_e4m3fn")
    q.refuse("fmt", "is '" + fmt + "'; unimoe's FP8 variants hold e4m3 weights");
  const std::string scheme = q.text("activation_scheme", "dynamic");
  if (scheme != "dynamic" && scheme != "static")
    q.refuse("activation_scheme", "is '" + scheme + "'; allowed: dynamic, static");
  if (!q.has("weight_block_size")) return QuantVariant::FP8PerTensor;
  const Json& block = q.at("weight_block_size");
  if (block != Json::array({128, 128}))
    q.refuse("weight_block_size", "is " + shown(block) +
                                      "; unimoe's block-scaled FP8 (FP8Block128) has 128x128 blocks");
  // FP8Block128 quantizes activations on the device, per token and 128
  // columns; a checkpoint's static activation scales have no place there.
  if (scheme != "dynamic")
    q.refuse("activation_scheme", "is 'static' with weight_block_size [128, 128]; FP8Block128 "
                                  "computes its activation scales per token on the device");
  return QuantVariant::FP8Block128;
}

// ------------------------------------------------------------ families ----
// Each reads the keys of one transformers config class; the default after
// a key is that class's default (the class is named above each function).

// MixtralConfig; MiniMaxConfig (MiniMax-Text-01, M1) has the same defaults
// and Mixtral's sparse block. ids topk(softmax(x)), weights renormalized to
// sum 1: Renormalize's formula (RenormalizeNaive's too; the presets use
// Renormalize).
MoEConfig mixtral(const Fields& f) {
  MoEConfig c = base(RoutingPolicy::Renormalize, f.integer("num_local_experts", 8),
                     f.integer("num_experts_per_tok", 2), f.integer("hidden_size", 4096),
                     f.integer("intermediate_size", 14336));
  c.experts.activation = gated_activation(f);
  return c;
}

MoEConfig minimax(const Fields& f) {
  // A MiniMax-M2 config saved under this model_type would be read as a
  // softmax router by transformers, yet its weights were trained with
  // sigmoid scores and a bias.
  const std::string m2 =
      "transformers' MiniMax (model_type minimax: MiniMax-Text-01, M1) does not read it: its "
      "router is Mixtral's softmax; a MiniMax-M2 config has model_type minimax_m2";
  f.expect_text_if_present("scoring_func", "softmax", m2);
  if (f.boolean("use_routing_bias", false)) f.refuse("use_routing_bias", "is true; " + m2);
  return mixtral(f);
}

// Qwen2MoeConfig (defaults of Qwen1.5-MoE-A2.7B), Qwen3MoeConfig. ids
// topk(softmax(x)); weights renormalized when norm_topk_prob (Renormalize),
// else the softmax over all E (Default). Qwen2-MoE's shared expert is not
// included.
MoEConfig qwen_moe(const Fields& f, int experts, int top_k, int intermediate) {
  const bool renormalize = f.boolean("norm_topk_prob", false);
  MoEConfig c = base(renormalize ? RoutingPolicy::Renormalize : RoutingPolicy::Default,
                     // transformers 5 saves num_experts as num_local_experts
                     f.integer("num_experts", "num_local_experts", experts),
                     f.integer("num_experts_per_tok", top_k),
                     f.integer("hidden_size", 2048), f.integer("moe_intermediate_size", intermediate));
  c.experts.activation = gated_activation(f);
  return c;
}
MoEConfig qwen2_moe(const Fields& f) { return qwen_moe(f, 60, 4, 1408); }
MoEConfig qwen3_moe(const Fields& f) { return qwen_moe(f, 128, 8, 768); }

// DeepseekV2Config. Softmax scores, greedy top-k, weights p[ids] *
// routed_scaling_factor without renormalization: Default where the scale
// is 1 (DeepSeek-V2-Lite); the group-limited variant of DeepSeek-V2 itself
// and a scale != 1 have no unimoe policy.
MoEConfig deepseek_v2(const Fields& f) {
  f.expect_text_if_present("scoring_func", "softmax",
                           "DeepSeek-V2's router scores experts by softmax");
  const std::string method = f.text("topk_method", "greedy");
  if (method == "group_limited_greedy") {
    const int groups = f.integer("n_group"), kept = f.integer("topk_group");
    // Keeping every group is the greedy top-k.
    if (kept < groups)
      f.refuse("topk_method",
               "is 'group_limited_greedy' with n_group " + std::to_string(groups) + " and topk_group " +
                   std::to_string(kept) +
                   ": groups ranked by their best softmax probability; no unimoe policy computes "
                   "that (DeepSeekV3 ranks groups by the sum of the two best sigmoid + bias scores)");
  } else if (method != "greedy") {
    f.refuse("topk_method", "is '" + method + "'; DeepSeek-V2 defines greedy and group_limited_greedy");
  }
  if (f.boolean("norm_topk_prob", false))
    f.refuse("norm_topk_prob",
             "is true; transformers' DeepseekV2 ignores it and scales p[ids], DeepSeek's own code "
             "renormalizes without the scale: the formula is not established");
  const float scale = f.number("routed_scaling_factor", 1.0f);
  if (scale != 1.0f)
    f.refuse("routed_scaling_factor",
             "is " + shown(f.at("routed_scaling_factor")) +
                 "; weights p[ids] * scale without renormalization: policy Default has no scale");
  // num_experts_per_tok defaults to None (a dense model) in transformers.
  MoEConfig c = base(RoutingPolicy::Default, f.integer("n_routed_experts", 64),
                     f.integer("num_experts_per_tok"), f.integer("hidden_size", 4096),
                     f.integer("moe_intermediate_size", 1407));
  c.experts.activation = gated_activation(f);
  return c;
}

// DeepseekV3Config (Kimi-K2 ships its fields). Sigmoid scores plus the
// score-correction bias, groups by their two best biased scores, top-k over
// the kept groups, weights s[ids] renormalized and scaled: DeepSeekV3
// (Kimi-K2 has one group).
MoEConfig deepseek_v3(const Fields& f) {
  f.expect_text_if_present("scoring_func", "sigmoid",
                           "DeepSeek-V3's router (noaux_tc) scores experts by sigmoid");
  f.expect_text_if_present("topk_method", "noaux_tc",
                           "policy DeepSeekV3 is the noaux_tc selection (biased sigmoid scores)");
  if (!f.boolean("norm_topk_prob", true))
    f.refuse("norm_topk_prob", "is false: weights s[ids] * scale without renormalization; policy "
                               "DeepSeekV3 renormalizes, Sigmoid has no groups, bias or scale");
  MoEConfig c = base(RoutingPolicy::DeepSeekV3, f.integer("n_routed_experts", 256),
                     f.integer("num_experts_per_tok", 8), f.integer("hidden_size", 7168),
                     f.integer("moe_intermediate_size", 2048));
  c.routing.n_group = f.integer("n_group", 8);
  c.routing.topk_group = f.integer("topk_group", 4);
  c.routing.routed_scaling_factor = f.number("routed_scaling_factor", 2.5f);
  c.routing.has_bias = true;  // e_score_correction_bias, always present
  c.experts.activation = gated_activation(f);
  return c;
}

// GptOssConfig. Softmax over the top-k logits (Renormalize); the clamped
// SwiGLU with (up + 1) and biases on both expert GEMMs, whatever hidden_act
// says.
MoEConfig gpt_oss(const Fields& f) {
  MoEConfig c = base(RoutingPolicy::Renormalize, f.integer("num_local_experts", 128),
                     f.integer("num_experts_per_tok", 4), f.integer("hidden_size", 2880),
                     f.integer("intermediate_size", 2880));
  c.experts.activation = Activation::SwiGLUOai;
  c.experts.swiglu_alpha = f.number("swiglu_alpha", 1.702f);
  c.experts.swiglu_limit = f.number("swiglu_limit", 7.0f);
  c.experts.has_bias = true;
  return c;
}

// MiniMaxM2Config. Sigmoid scores plus the bias for the choice, weights
// s[ids] renormalized: DeepSeekV3 with one group and scale 1, i.e. MiniMax2.
MoEConfig minimax_m2(const Fields& f) {
  f.expect_text_if_present("scoring_func", "sigmoid", "MiniMax-M2's router scores experts by sigmoid");
  if (f.number("routed_scaling_factor", 1.0f) != 1.0f)
    f.refuse("routed_scaling_factor",
             "is " + shown(f.at("routed_scaling_factor")) +
                 "; transformers' MiniMaxM2 applies no scale, so its meaning here is not established");
  MoEConfig c = base(RoutingPolicy::MiniMax2, f.integer("num_local_experts", 256),
                     f.integer("num_experts_per_tok", 8), f.integer("hidden_size", 3072),
                     f.integer("intermediate_size", 1536));
  // transformers always holds e_score_correction_bias; MiniMax's own code
  // reads this flag.
  c.routing.has_bias = f.boolean("use_routing_bias", true);
  c.experts.activation = gated_activation(f);
  return c;
}

// Llama4TextConfig (under text_config, or a bare llama4_text config). The
// router is Llama4's formula, but the weight multiplies each expert's input,
// expert(w * x), where a unimoe layer computes w * expert(x); under SwiGLU
// these differ, so no unimoe config computes the layer. The refusal names
// the shape, for timing it.
[[noreturn]] void refuse_llama4(const Fields& top, const Fields& text) {
  const int experts = text.integer("num_local_experts", 16), top_k = text.integer("num_experts_per_tok", 1);
  const int hidden = text.integer("hidden_size", 5120);
  // intermediate_size is the routed expert's; intermediate_size_mlp the dense layers'.
  const int intermediate = text.integer("intermediate_size", 8192);
  top.refuse("model_type",
             "is Llama-4, whose MoE multiplies each token's input to its expert by the router "
             "weight, expert(sigmoid(x) * h); a unimoe layer weights the expert's output, "
             "w * expert(h), which differs under SwiGLU, so no unimoe config computes this layer. "
             "To time the same shape: policy=Llama4 E=" + std::to_string(experts) + " K=" +
                 std::to_string(top_k) + " H=" + std::to_string(hidden) +
                 " I=" + std::to_string(intermediate));
}

using Mapping = MoEConfig (*)(const Fields&);

struct Family {
  const char* model_type;
  Mapping map;
};

constexpr Family kFamilies[] = {
    {"mixtral", mixtral},         {"minimax", minimax},         {"qwen2_moe", qwen2_moe},
    {"qwen3_moe", qwen3_moe},     {"deepseek_v2", deepseek_v2}, {"deepseek_v3", deepseek_v3},
    {"kimi_k2", deepseek_v3},     {"gpt_oss", gpt_oss},         {"minimax_m2", minimax_m2},
};

}  // namespace

MoEConfig config_from_hf_json(const std::string& json_text) {
  Json doc;
  try {
    doc = Json::parse(json_text);
  } catch (const Json::parse_error& e) {
    throw Error("hf_config", std::string("is not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) throw Error("hf_config", "is " + std::string(doc.type_name()) + ", not a JSON object");
  const Fields top(doc, "");
  const std::string model_type = top.text("model_type");
  if (model_type == "llama4") {
    const Json* text = top.object("text_config");
    const Json empty = Json::object();  // transformers' Llama4TextConfig defaults
    refuse_llama4(top, Fields(text != nullptr ? *text : empty, "text_config."));
  }
  if (model_type == "llama4_text") refuse_llama4(top, top);
  std::string known;
  for (const Family& family : kFamilies) {
    if (model_type != family.model_type) {
      known += std::string(known.empty() ? "" : ", ") + family.model_type;
      continue;
    }
    MoEConfig c = family.map(top);
    c.experts.quant = quant_of(top);
    validate(c);
    return c;
  }
  top.refuse("model_type", "is '" + model_type + "'; supported: " + known +
                               " (llama4 is read and refused; docs/hf-configs.md)");
}

}  // namespace unimoe
