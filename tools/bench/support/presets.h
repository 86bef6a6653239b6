// Model presets: the MoE layer configs of the models unimoe serves, by name.
#pragma once

#include <string>
#include <vector>

#include "unimoe/unimoe.h"

namespace unimoe {

struct Preset {
  std::string name;
  std::string model;  // what it is, for the help text
  MoEConfig config;
};

const std::vector<Preset>& presets();

// A BF16 SwiGLU config with every other field at its default.
MoEConfig moe_config(RoutingPolicy policy, int num_experts, int top_k, int hidden,
                     int intermediate);
// Throws Error naming the known presets when `name` is not one.
const Preset& find_preset(const std::string& name);

}  // namespace unimoe
