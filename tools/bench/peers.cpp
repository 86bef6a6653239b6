// Peer timings beside unimoe's: the peer scripts run in the same process
// tree, and the measured peer timings of an anchors file.
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench.h"

namespace unimoe::bench {
namespace {

// The shapes torch_peer.py knows (its SHAPES table).
const std::set<std::string> kTorchPeerShapes = {"mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b",
                                                "dsv3-tp8", "gpt-oss-120b"};

// Every point of (preset, T), one per backend.
std::vector<Point*> find_points(RunResult& r, const std::string& preset, int tokens) {
  std::vector<Point*> found;
  for (Point& p : r.points)
    if (p.preset == preset && p.tokens == tokens) found.push_back(&p);
  return found;
}

// "1,8,64": the run's token counts.
std::string token_list(const Options& opt) {
  std::string tokens;
  for (int t : opt.tokens) tokens += (tokens.empty() ? "" : ",") + std::to_string(t);
  return tokens;
}

// The command line of the MXFP4 peer over the run's presets and token counts.
std::string mxfp4_peer_command(const Options& opt) {
  std::string shapes;
  for (const Preset& shape : opt.shapes) shapes += (shapes.empty() ? "" : ",") + shape.name;
  return "python3 '" + opt.mxfp4_peer + "' --shapes " + shapes + " --tokens " + token_list(opt);
}

// The vLLM peer's --quant for a quant variant ("": it has none).
std::string vllm_peer_quant(QuantVariant quant) {
  switch (quant) {
    case QuantVariant::BF16: return "bf16";
    case QuantVariant::FP8Block128: return "fp8_block";
    case QuantVariant::FP8PerTensor: return "fp8_tensor";
    default: return "";
  }
}

bool is_preset(const std::string& name) {
  for (const Preset& p : presets())
    if (p.name == name) return true;
  return false;
}

// Runs a peer script that prints one JSON line per (shape, T): keeps each
// line for the run's JSON, reports a point's error on stderr and hands the
// others, with the points of their (shape, T), to `use`.
void run_peer_script(const std::string& cmd, const char* label, RunResult& result,
                     const std::function<void(const nlohmann::json&, const std::vector<Point*>&)>& use) {
  std::fprintf(stderr, "peer: %s\n", cmd.c_str());
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) {
    std::fprintf(stderr, "peer: could not start python3\n");
    return;
  }
  std::string line;
  char chunk[4096];
  while (std::fgets(chunk, sizeof chunk, pipe.get())) {
    line += chunk;
    if (line.empty() || line.back() != '\n') continue;  // a line longer than the chunk
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (!row.is_discarded() && row.contains("shape") && row.contains("T")) result.peer_rows.push_back(line);
    line.clear();
    if (row.is_discarded() || !row.contains("shape") || !row.contains("T")) continue;
    if (row.contains("error")) {
      std::fprintf(stderr, "peer: %s %s T=%d: %s\n", row.value("peer", label).c_str(),
                   row.value("shape", "").c_str(), row.value("T", -1), row["error"].dump().c_str());
      continue;
    }
    use(row, find_points(result, row.value("shape", ""), row.value("T", -1)));
  }
}

}  // namespace

void add_torch_peer(const Options& opt, RunResult& result) {
  if (opt.peer_script.empty()) return;
  std::string tokens;
  for (int t : opt.tokens) tokens += (tokens.empty() ? "" : ",") + std::to_string(t);
  for (const Preset& shape : opt.shapes) {
    const std::string& preset = shape.name;
    if (!kTorchPeerShapes.count(preset)) {
      std::fprintf(stderr, "peer: torch_peer.py has no shape %s; skipped\n", preset.c_str());
      continue;
    }
    const std::string cmd = "python3 '" + opt.peer_script + "' --shape " + preset + " --tokens " + tokens;
    std::fprintf(stderr, "peer: %s\n", cmd.c_str());
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
    if (!pipe) {
      std::fprintf(stderr, "peer: could not start python3\n");
      continue;
    }
    char line[4096];
    while (std::fgets(line, sizeof line, pipe.get())) {
      const auto row = nlohmann::json::parse(line, nullptr, false);
      if (row.is_discarded() || !row.contains("torch_grouped_us")) continue;
      for (Point* p : find_points(result, row.value("shape", ""), row.value("T", -1)))
        p->peers_us["torch_grouped"] = row["torch_grouped_us"].get<double>();
    }
  }
}

void add_mxfp4_peer(const Options& opt, RunResult& result) {
  if (opt.mxfp4_peer.empty()) return;
  run_peer_script(mxfp4_peer_command(opt), "oai_mxfp4", result,
                  [](const nlohmann::json& row, const std::vector<Point*>& points) {
                    for (Point* p : points) {
                      if (row.contains("us")) p->peers_us["oai_mxfp4"] = row["us"].get<double>();
                      if (row.contains("us_incl_routing_metadata"))
                        p->peers_us["oai_mxfp4_meta"] = row["us_incl_routing_metadata"].get<double>();
                    }
                  });
}

void add_vllm_peer(const Options& opt, RunResult& result) {
  if (opt.vllm_peer.empty()) return;
  std::map<std::string, std::string> shapes_by_quant;  // the peer's --quant -> its --shapes
  for (const Preset& shape : opt.shapes) {
    const std::string quant = vllm_peer_quant(shape.config.experts.quant);
    if (quant.empty()) {
      std::fprintf(stderr, "peer: vllm_fused_moe has no %s variant (only BF16, FP8Block128, FP8PerTensor); "
                   "%s skipped\n", to_string(shape.config.experts.quant).c_str(), shape.name.c_str());
    } else if (!is_preset(shape.name)) {
      std::fprintf(stderr, "peer: vllm_fused_moe knows the presets only; %s skipped\n", shape.name.c_str());
    } else {
      std::string& shapes = shapes_by_quant[quant];
      shapes += (shapes.empty() ? "" : ",") + shape.name;
    }
  }
  for (const auto& [quant, shapes] : shapes_by_quant) {
    const std::string cmd = "python3 '" + opt.vllm_peer + "' --shapes " + shapes + " --tokens " +
                            token_list(opt) + " --quant " + quant;
    run_peer_script(cmd, "vllm_fused_moe", result,
                    [](const nlohmann::json& row, const std::vector<Point*>& points) {
                      const std::string name = row.value("peer", "vllm_fused_moe");
                      for (Point* p : points) {
                        if (row.contains("us")) p->peers_us[name] = row["us"].get<double>();
                        if (row.contains("us_incl_align"))
                          p->peers_us[name + "_align"] = row["us_incl_align"].get<double>();
                      }
                    });
  }
}

void add_anchor_peers(const Options& opt, RunResult& result) {
  if (opt.anchors.empty()) return;
  std::ifstream in(opt.anchors);
  if (!in) throw Error("anchors", "cannot read '" + opt.anchors + "'");
  const auto doc = nlohmann::json::parse(in, nullptr, false);
  if (doc.is_discarded() || !doc.contains("rows")) throw Error("anchors", "'" + opt.anchors + "' has no rows");
  for (const auto& row : doc["rows"]) {
    for (Point* p : find_points(result, row.value("shape", ""), row.value("T", -1))) {
      if (row.contains("vllm_triton_experts_us")) p->peers_us["anchor_vllm_triton"] = row["vllm_triton_experts_us"];
      if (row.contains("torch_grouped_us")) p->peers_us["anchor_torch_grouped"] = row["torch_grouped_us"];
    }
  }
}

}  // namespace unimoe::bench
