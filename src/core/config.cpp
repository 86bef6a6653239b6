// MoEConfig helpers, the error type, and the config's one-line text form.
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "unimoe/unimoe.h"

namespace unimoe {

Error::Error(std::string field, const std::string& message)
    : std::invalid_argument(field + ": " + message), field_(std::move(field)) {}

int MoEConfig::local_experts() const {
  return experts.num_local_experts < 0 ? routing.num_experts : experts.num_local_experts;
}

int MoEConfig::gemm1_cols() const {
  return experts.activation == Activation::ReLU2 ? experts.intermediate
                                                 : 2 * experts.intermediate;
}

namespace {

// Shortest text that parses back to the same float.
std::string float_text(float v) {
  char buf[32];
  for (int precision = 6; precision <= 9; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return buf;
}

int parse_int(const std::string& key, const std::string& v) {
  std::size_t used = 0;
  int out = 0;
  try {
    out = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty()) throw Error(key, "'" + v + "' is not an integer");
  return out;
}

float parse_float(const std::string& key, const std::string& v) {
  std::size_t used = 0;
  float out = 0;
  try {
    out = std::stof(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty()) throw Error(key, "'" + v + "' is not a number");
  return out;
}

bool parse_bool(const std::string& key, const std::string& v) {
  if (v == "1" || v == "true") return true;
  if (v == "0" || v == "false") return false;
  throw Error(key, "'" + v + "' is not a boolean; allowed: 0, 1, true, false");
}

}  // namespace

std::string MoEConfig::to_string() const {
  std::ostringstream s;
  s << "policy=" << unimoe::to_string(routing.policy) << " E=" << routing.num_experts
    << " K=" << routing.top_k << " n_group=" << routing.n_group
    << " topk_group=" << routing.topk_group
    << " scale=" << float_text(routing.routed_scaling_factor)
    << " routing_bias=" << routing.has_bias
    << " logits=" << unimoe::to_string(routing.logits_type) << " H=" << experts.hidden
    << " I=" << experts.intermediate << " act=" << unimoe::to_string(experts.activation)
    << " alpha=" << float_text(experts.swiglu_alpha)
    << " limit=" << float_text(experts.swiglu_limit) << " expert_bias=" << experts.has_bias
    << " local_offset=" << experts.local_expert_offset
    << " local_experts=" << experts.num_local_experts
    << " quant=" << unimoe::to_string(experts.quant) << " backend=" << options.backend
    << " deterministic=" << options.deterministic;
  // Printed only when forced, so that the text of every default config (the
  // tuning cache's key) stays as it was.
  if (options.routing_variant != "auto") s << " routing_variant=" << options.routing_variant;
  return s.str();
}

MoEConfig MoEConfig::parse(const std::string& text) {
  MoEConfig c;
  std::istringstream in(text);
  std::string item;
  while (in >> item) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error("config", "'" + item + "' is not key=value");
    const std::string key = item.substr(0, eq);
    const std::string v = item.substr(eq + 1);
    if (key == "policy") c.routing.policy = parse_routing_policy(v);
    else if (key == "E") c.routing.num_experts = parse_int(key, v);
    else if (key == "K") c.routing.top_k = parse_int(key, v);
    else if (key == "n_group") c.routing.n_group = parse_int(key, v);
    else if (key == "topk_group") c.routing.topk_group = parse_int(key, v);
    else if (key == "scale") c.routing.routed_scaling_factor = parse_float(key, v);
    else if (key == "routing_bias") c.routing.has_bias = parse_bool(key, v);
    else if (key == "logits") c.routing.logits_type = parse_logits_type(v);
    else if (key == "H") c.experts.hidden = parse_int(key, v);
    else if (key == "I") c.experts.intermediate = parse_int(key, v);
    else if (key == "act") c.experts.activation = parse_activation(v);
    else if (key == "alpha") c.experts.swiglu_alpha = parse_float(key, v);
    else if (key == "limit") c.experts.swiglu_limit = parse_float(key, v);
    else if (key == "expert_bias") c.experts.has_bias = parse_bool(key, v);
    else if (key == "local_offset") c.experts.local_expert_offset = parse_int(key, v);
    else if (key == "local_experts") c.experts.num_local_experts = parse_int(key, v);
    else if (key == "quant") c.experts.quant = parse_quant_variant(v);
    else if (key == "backend") c.options.backend = v;
    else if (key == "deterministic") c.options.deterministic = parse_bool(key, v);
    else if (key == "routing_variant") c.options.routing_variant = v;
    else
      throw Error("config", "unknown key '" + key +
                                "'; allowed: policy E K n_group topk_group scale routing_bias "
                                "logits H I act alpha limit expert_bias local_offset "
                                "local_experts quant backend deterministic routing_variant");
  }
  return c;
}

}  // namespace unimoe
