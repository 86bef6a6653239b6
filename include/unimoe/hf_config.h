// The MoE layer config of a Hugging Face model, read from its config.json.
//
// docs/hf-configs.md lists each model_type read, the fields and how they
// map, and what is refused and why. Like unimoe.h, this header needs no
// CUDA header; the function lives in the host library (unimoe::host).
#pragma once

#include <string>

#include "unimoe/unimoe.h"

namespace unimoe {

// The MoEConfig of the routed experts of a Hugging Face model config (the
// text of its config.json): routing policy and its parameters, E, K, H, I,
// activation, expert biases and quant variant; BackendOptions and the
// expert-parallel range stay at their defaults, logits are F32. Shared
// experts and dense layers are not part of it.
//
// Throws Error, field "hf_config.<key>" ("hf_config" for text that is no
// JSON object), for an unknown model_type, a key of the wrong JSON type, a
// key that is missing where transformers has no default, and a router,
// activation or quantization that no unimoe config computes exactly; the
// message says what. A key left out takes transformers' default. The
// result passes validate() (whose Error comes through where it does not).
MoEConfig config_from_hf_json(const std::string& json_text);

}  // namespace unimoe
