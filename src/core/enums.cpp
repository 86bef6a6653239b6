// Printing and parsing of the public enums. Each table is the one place a
// name is spelled; parse errors list every allowed spelling.
#include <array>
#include <string>
#include <utility>

#include "unimoe/unimoe.h"

namespace unimoe {
namespace {

template <typename Enum, std::size_t N>
using NameTable = std::array<std::pair<Enum, const char*>, N>;

constexpr NameTable<RoutingPolicy, 10> kPolicyNames{{
    {RoutingPolicy::Default, "Default"},
    {RoutingPolicy::Renormalize, "Renormalize"},
    {RoutingPolicy::RenormalizeNaive, "RenormalizeNaive"},
    {RoutingPolicy::TopK, "TopK"},
    {RoutingPolicy::Sigmoid, "Sigmoid"},
    {RoutingPolicy::SigmoidRenorm, "SigmoidRenorm"},
    {RoutingPolicy::TopKSigmoid, "TopKSigmoid"},
    {RoutingPolicy::Llama4, "Llama4"},
    {RoutingPolicy::DeepSeekV3, "DeepSeekV3"},
    {RoutingPolicy::MiniMax2, "MiniMax2"},
}};

constexpr NameTable<Activation, 4> kActivationNames{{
    {Activation::SwiGLU, "SwiGLU"},
    {Activation::GeGLU, "GeGLU"},
    {Activation::ReLU2, "ReLU2"},
    {Activation::SwiGLUOai, "SwiGLUOai"},
}};

constexpr NameTable<QuantVariant, 5> kQuantNames{{
    {QuantVariant::BF16, "BF16"},
    {QuantVariant::FP8PerTensor, "FP8PerTensor"},
    {QuantVariant::FP8Block128, "FP8Block128"},
    {QuantVariant::MXFP4, "MXFP4"},
    {QuantVariant::NVFP4, "NVFP4"},
}};

constexpr NameTable<LogitsType, 2> kLogitsNames{{
    {LogitsType::F32, "F32"},
    {LogitsType::BF16, "BF16"},
}};

template <typename Enum, std::size_t N>
std::string name_of(const NameTable<Enum, N>& table, Enum v) {
  for (const auto& [value, name] : table)
    if (value == v) return name;
  return "<invalid " + std::to_string(static_cast<int>(v)) + ">";
}

template <typename Enum, std::size_t N>
Enum parse_name(const NameTable<Enum, N>& table, const std::string& s, const char* field) {
  std::string allowed;
  for (const auto& [value, name] : table) {
    if (s == name) return value;
    allowed += (allowed.empty() ? "" : ", ") + std::string(name);
  }
  throw Error(field, "unknown value '" + s + "'; allowed: " + allowed);
}

}  // namespace

std::string to_string(RoutingPolicy v) { return name_of(kPolicyNames, v); }
std::string to_string(Activation v) { return name_of(kActivationNames, v); }
std::string to_string(QuantVariant v) { return name_of(kQuantNames, v); }
std::string to_string(LogitsType v) { return name_of(kLogitsNames, v); }

RoutingPolicy parse_routing_policy(const std::string& s) {
  return parse_name(kPolicyNames, s, "routing.policy");
}
Activation parse_activation(const std::string& s) {
  return parse_name(kActivationNames, s, "experts.activation");
}
QuantVariant parse_quant_variant(const std::string& s) {
  return parse_name(kQuantNames, s, "experts.quant");
}
LogitsType parse_logits_type(const std::string& s) {
  return parse_name(kLogitsNames, s, "routing.logits_type");
}

}  // namespace unimoe
