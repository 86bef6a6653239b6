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

// The command line of the MXFP4 peer over the run's presets and token counts.
std::string mxfp4_peer_command(const Options& opt) {
  std::string shapes, tokens;
  for (const Preset& shape : opt.shapes) shapes += (shapes.empty() ? "" : ",") + shape.name;
  for (int t : opt.tokens) tokens += (tokens.empty() ? "" : ",") + std::to_string(t);
  return "python3 '" + opt.mxfp4_peer + "' --shapes " + shapes + " --tokens " + tokens;
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
  const std::string cmd = mxfp4_peer_command(opt);
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
    line.clear();
    if (row.is_discarded() || !row.contains("shape") || !row.contains("T")) continue;
    if (row.contains("error")) {
      std::fprintf(stderr, "peer: oai_mxfp4 %s T=%d: %s\n", row.value("shape", "").c_str(),
                   row.value("T", -1), row["error"].dump().c_str());
      continue;
    }
    for (Point* p : find_points(result, row.value("shape", ""), row.value("T", -1))) {
      if (row.contains("us")) p->peers_us["oai_mxfp4"] = row["us"].get<double>();
      if (row.contains("us_incl_routing_metadata"))
        p->peers_us["oai_mxfp4_meta"] = row["us_incl_routing_metadata"].get<double>();
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
