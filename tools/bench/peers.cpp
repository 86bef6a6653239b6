// Peer timings beside unimoe's: the PyTorch peer script run in the same
// process tree, and the measured peer timings of an anchors file.
#include <cstdio>
#include <fstream>
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
