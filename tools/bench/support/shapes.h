// The shapes unimoe-bench times: model presets by name, or one config given
// on the command line instead (--config, --hf-config).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "support/presets.h"

namespace unimoe {

// The command line's say on which shapes run.
struct ShapeRequest {
  std::string presets = "qwen3-30b-a3b";  // --preset: names, comma-separated, or "all"
  bool presets_given = false;             // --preset was on the command line
  std::string config;                     // --config: a MoEConfig's text ("": none)
  std::string hf_config;                  // --hf-config: a config.json's path ("": none)
  std::optional<QuantVariant> quant;      // --quant, when given
};

// The shapes to time, each named (the table's and the JSON's "preset") and
// with its quant variant set: --quant where given, else BF16 for a preset
// and the config's own for --config and --hf-config. The named presets, or
// the one shape of --config (named "config") or --hf-config (named by its
// model_type). Throws Error: an unknown preset; --config and --hf-config
// together, or either with --preset; --config text that does not parse or
// sets backend or routing_variant (the bench's --backend and
// --routing-variant choose those); an unreadable file; any refusal of
// config_from_hf_json; a config that validate() refuses.
std::vector<Preset> bench_shapes(const ShapeRequest& request);

}  // namespace unimoe
