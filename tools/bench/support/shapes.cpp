#include "support/shapes.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "unimoe/hf_config.h"

namespace unimoe {
namespace {

std::vector<Preset> named_presets(const ShapeRequest& request) {
  std::vector<Preset> out;
  if (request.presets == "all") {
    out = presets();
  } else {
    std::stringstream list(request.presets);
    for (std::string name; std::getline(list, name, ',');) out.push_back(find_preset(name));
  }
  for (Preset& p : out) p.config.experts.quant = request.quant.value_or(QuantVariant::BF16);
  return out;
}

Preset from_text(const std::string& text) {
  MoEConfig c = MoEConfig::parse(text);
  // Forced through the text, these would be overwritten per run by the
  // flags that choose them for every shape.
  const BackendOptions defaults;
  if (c.options.backend != defaults.backend)
    throw Error("config", "sets backend=" + c.options.backend + "; choose it with --backend");
  if (c.options.routing_variant != defaults.routing_variant)
    throw Error("config", "sets routing_variant=" + c.options.routing_variant +
                              "; choose it with --routing-variant");
  return {"config", "--config", c};
}

Preset from_hf_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("hf-config", "cannot read '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  const MoEConfig c = config_from_hf_json(text.str());
  // The file parsed as an object with a model_type string, or the call
  // above would have thrown.
  const std::string model_type = nlohmann::json::parse(text.str()).at("model_type").get<std::string>();
  return {model_type, path, c};
}

}  // namespace

std::vector<Preset> bench_shapes(const ShapeRequest& request) {
  const bool config = !request.config.empty(), hf = !request.hf_config.empty();
  if (!config && !hf) return named_presets(request);
  if (config && hf)
    throw Error("config", "--config and --hf-config each give the one shape to time; use one");
  if (request.presets_given)
    throw Error("preset", std::string(config ? "--config" : "--hf-config") +
                              " times its shape in place of the presets; drop --preset");
  Preset shape = config ? from_text(request.config) : from_hf_file(request.hf_config);
  if (request.quant) shape.config.experts.quant = *request.quant;
  validate(shape.config);
  return {shape};
}

}  // namespace unimoe
