// unimoe-bench: times the MoE layer over model presets (or one config given
// by --config or --hf-config) and token counts.
// Prints a table (time, floor, time/floor, TB/s, TFLOP/s, per-stage split,
// peers) and writes the same as JSON. Without a GPU it runs the CPU
// reference at a reduced size and says so.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "bench.h"
#include "unimoe/ep.h"
#include "json_file.h"
#include "plan/layer_plan.h"
#include "ref/synthetic.h"
#include "support/presets.h"
#include "support/shapes.h"

namespace unimoe::bench {
namespace {

std::string preset_help() {
  std::string s = "model presets, comma-separated, or 'all' (not with --config, --hf-config):";
  for (const Preset& p : presets()) s += "\n  " + p.name + " (" + p.model + ")";
  return s;
}

// A stage's time over its own floor is printed only where that floor is at
// least this long: below it the stage's time is its launch and its PDL
// wait, and the ratio says nothing about how it moves bytes.
constexpr double kStageRatioMinFloorUs = 2.0;

const StageFloor* stage_floor_of(const Point& p, const std::string& stage) {
  for (const StageFloor& f : p.stage_floor)
    if (stage == f.stage) return &f;
  return nullptr;
}

void print_table(const RunResult& r) {
  std::printf("\n%s on %s\n", r.mode == "gpu" ? "unimoe MoE layer" : "CPU reference", r.device.c_str());
  if (!r.note.empty()) std::printf("NOTE: %s\n", r.note.c_str());
  if (r.mode == "gpu")
    std::printf("ceilings: %.3f TB/s (the faster of a copy, %.3f, and a read, %.3f), %.1f TFLOP/s bf16, "
                "%.1f TFLOP/s e4m3 (measured in this run)\n",
                r.ceilings.bandwidth_tbps, r.ceilings.copy_tbps, r.ceilings.read_tbps, r.ceilings.matmul_tflops,
                r.ceilings.fp8_matmul_tflops);
  else
    std::printf("ceilings: %.3f TB/s, %.1f TFLOP/s bf16, %.1f TFLOP/s e4m3 (H200 reference values)\n",
                r.ceilings.bandwidth_tbps, r.ceilings.matmul_tflops, r.ceilings.fp8_matmul_tflops);
  std::printf("columns: time and floor in us; rel_err vs the CPU reference; ");
  if (r.mode == "gpu")
    std::printf("a stage's (Nx) is its time over its own floor, where that floor is %.0f us or more; ",
                kStageRatioMinFloorUs);
  std::printf("a peer's (xN) is its time over unimoe's\n");
  std::printf("%-16s %-13s %6s %6s %10s %10s %7s %7s %8s %9s  %s\n", "preset", "backend", "T", "active", "time_us",
              "floor_us", "t/floor", "TB/s", "TFLOP/s", "rel_err", "stages (us) | peers (us)");
  for (const Point& p : r.points) {
    std::string stages;
    for (const auto& [name, us] : p.stage_us) {
      char buf[64];
      const StageFloor* f = stage_floor_of(p, name);
      if (f != nullptr && f->floor_us >= kStageRatioMinFloorUs)
        std::snprintf(buf, sizeof buf, "%s %.1f (%.2fx) ", name.c_str(), us, us / f->floor_us);
      else
        std::snprintf(buf, sizeof buf, "%s %.1f ", name.c_str(), us);
      stages += buf;
    }
    if (!p.gemm2_gate.empty()) stages += "(gate: " + p.gemm2_gate + ") ";
    for (const auto& [name, us] : p.peers_us) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "| %s %.1f (x%.2f) ", name.c_str(), us, us / p.time_us);
      stages += buf;
    }
    const bool gpu = r.mode == "gpu";
    // Ratios and rates against GPU ceilings mean nothing for CPU times.
    char ratio[16] = "-", err[16] = "-", tbps[16] = "-", tflops[16] = "-";
    if (gpu) {
      std::snprintf(ratio, sizeof ratio, "%.2f", p.time_us / p.floor.floor_us);
      std::snprintf(tbps, sizeof tbps, "%.3f", p.floor.bytes / (p.time_us * 1e6));
      std::snprintf(tflops, sizeof tflops, "%.1f", p.floor.flops / (p.time_us * 1e6));
    }
    if (p.failed) {
      std::snprintf(err, sizeof err, "FAILED");
    } else if (p.rel_err >= 0) {
      std::snprintf(err, sizeof err, "%.2e", p.rel_err);
    }
    std::printf("%-16s %-13s %6d %6.0f %10.1f %10.1f %7s %7s %8s %9s  %s\n", p.preset.c_str(),
                p.backend.c_str(), p.tokens, p.active_experts, p.time_us, p.floor.floor_us, ratio,
                tbps, tflops, err, stages.c_str());
  }
  if (r.mode != "gpu") return;
  std::map<std::string, std::pair<double, int>> per_backend;  // sum of log(t/floor), points
  for (const Point& p : r.points) {
    auto& [log_sum, n] = per_backend[p.backend];
    log_sum += std::log(p.time_us / p.floor.floor_us);
    ++n;
  }
  for (const auto& [backend, acc] : per_backend)
    std::printf("backend %s: geometric mean of time/floor over %d points: %.3f\n", backend.c_str(),
                acc.second, std::exp(acc.first / acc.second));
}

std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

// "1,8,64" -> {1, 8, 64}; every value an integer >= 1, else Error(field).
std::vector<int> parse_counts(const std::string& list, const std::string& field) {
  std::vector<int> out;
  for (const std::string& item : split_list(list)) {
    std::size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || v < 1)
      throw Error(field, "'" + item + "' is not an integer >= 1");
    out.push_back(v);
  }
  return out;
}

void write_json(const Options& opt, const RunResult& r) {
  nlohmann::json doc;
  doc["tool"] = "unimoe-bench";
  doc["version"] = kVersion;
  doc["mode"] = r.mode;
  doc["device"] = r.device;
  doc["note"] = r.note;
  doc["routing"] = opt.routing;
  doc["dev"] = opt.dev.to_string();  // the development overrides the run applied ("" for none)
  doc["ceilings"] = {{"bandwidth_TBps", r.ceilings.bandwidth_tbps},
                     {"matmul_TFLOPs", r.ceilings.matmul_tflops},
                     {"fp8_matmul_TFLOPs", r.ceilings.fp8_matmul_tflops}};
  if (r.mode == "gpu") {
    doc["ceilings"]["copy_TBps"] = r.ceilings.copy_tbps;
    doc["ceilings"]["read_TBps"] = r.ceilings.read_tbps;
  }
  for (const Point& p : r.points) {
    nlohmann::json row = {{"preset", p.preset},
                          {"backend", p.backend},
                          {"config", p.config},
                          {"T", p.tokens},
                          {"active_experts", p.active_experts},
                          {"time_us", p.time_us},
                          {"floor_us", p.floor.floor_us},
                          {"memory_floor_us", p.floor.memory_us},
                          {"compute_floor_us", p.floor.compute_us},
                          {"bytes", p.floor.bytes},
                          {"flops", p.floor.flops}};
    if (r.mode == "gpu") {
      row["time_over_floor"] = p.time_us / p.floor.floor_us;
      row["TBps"] = p.floor.bytes / (p.time_us * 1e6);
      row["TFLOPs"] = p.floor.flops / (p.time_us * 1e6);
    }
    if (p.error_bound >= 0) {
      // NaN is no JSON number: a broken output is written as null.
      row["rel_err"] = std::isnan(p.rel_err) ? nlohmann::json(nullptr) : nlohmann::json(p.rel_err);
      row["error_bound"] = p.error_bound;
      row["failed"] = p.failed;
    } else if (p.rel_err >= 0) {
      row["rel_err"] = p.rel_err;
    }
    for (const auto& [name, us] : p.stage_us) row["stages_us"][name] = us;
    for (const StageFloor& f : p.stage_floor)
      row["stage_floors"][f.stage] = {{"floor_us", f.floor_us}, {"bytes", f.bytes}, {"flops", f.flops}};
    for (const auto& [name, us] : p.peers_us) row["peers_us"][name] = us;
    if (!p.choice.empty()) row["tuned_choice"] = p.choice;
    if (!p.plan.empty()) row["plan"] = p.plan;
    if (!p.gemm2_gate.empty()) row["gemm2_gate"] = p.gemm2_gate;
    if (!p.gemm2_work.empty()) row["gemm2_work"] = p.gemm2_work;
    if (!p.tuning_log.empty()) row["tuning_log"] = p.tuning_log;
    doc["points"].push_back(row);
  }
  for (const std::string& line : r.peer_rows) doc["peer_rows"].push_back(nlohmann::json::parse(line));
  write_json_file(doc, opt.json_path);
  std::printf("wrote %s\n", opt.json_path.c_str());
}

}  // namespace
}  // namespace unimoe::bench

int main(int argc, char** argv) {
  using namespace unimoe;
  using namespace unimoe::bench;
  Options opt;
  ShapeRequest shapes;
  std::string token_list = "1,8,64,512,4096,16384", quant;
  CLI::App app{"unimoe-bench: time the MoE layer over model presets and token counts"};
  app.add_option("--preset,-p", shapes.presets, preset_help())->capture_default_str();
  app.add_option("--config", shapes.config,
                 "time this one config in place of the presets, in MoEConfig's text form, e.g. "
                 "\"policy=Renormalize E=128 K=8 H=2048 I=768\" (unset keys take their defaults; "
                 "docs/benchmarking.md); named 'config'");
  app.add_option("--hf-config", shapes.hf_config,
                 "time the routed experts of a Hugging Face config.json in place of the presets "
                 "(docs/hf-configs.md); named by its model_type");
  app.add_option("--tokens,-t", token_list, "token counts T, comma-separated")->capture_default_str();
  std::string backend_list = "auto";
  app.add_option("--backend", backend_list, "experts backends, comma-separated: auto, mma, cutlass, stream")
      ->capture_default_str();
  app.add_option("--quant", quant,
                 "BF16, FP8PerTensor, FP8Block128, MXFP4, NVFP4 (default: BF16 for presets, the "
                 "config's own for --config and --hf-config)");
  app.add_flag("--static-scales", opt.static_scales,
               "FP8PerTensor: give the activations' static scales with the weights (x_scale, "
               "act_scale) instead of computing them per call");
  app.add_option("--logits", opt.logits_type, "router logits type for every shape: F32 or BF16 (default: the shape's)")
      ->check(CLI::IsMember({"F32", "BF16"}));
  app.add_option("--routing", opt.routing,
                 "routing distribution of the logits: uniform, skewed, zipf:S (expert popularity "
                 "~ 1/(rank+1)^S), hot:P (one expert chosen by a fraction P of the tokens)")
      ->check([](const std::string& s) {
        try {
          ref::check_routing_distribution(s, "--routing");
          return std::string();
        } catch (const Error& e) {  // CLI11 names the option itself
          return std::string(e.what()).substr(e.field().size() + 2);
        }
      })
      ->capture_default_str();
  app.add_option("--iters", opt.iters, "timed graph replays per point")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--rotate", opt.rotate, "input sets rotated per replay (0: default 4)")->capture_default_str();
  app.add_option("--check-tokens", opt.check_tokens, "tokens checked against the CPU reference")->capture_default_str();
  app.add_flag("--cpu", opt.force_cpu, "run the CPU reference (reduced size) even where a GPU exists");
  app.add_option("--peer", opt.peer_script, "PyTorch peer script to run side by side (bench/peers/torch_peer.py)");
  app.add_option("--mxfp4-peer", opt.mxfp4_peer,
                 "OpenAI triton_kernels MXFP4 peer script to run side by side "
                 "(bench/peers/oai_mxfp4_peer.py; scripts/setup.sh --peers fetches its package)");
  app.add_option("--vllm-peer", opt.vllm_peer,
                 "vLLM Triton fused_moe peer script to run side by side, in the run's quant variant "
                 "(bench/peers/vllm_fused_moe_peer.py; scripts/setup.sh --peers fetches its files)");
  app.add_option("--anchors", opt.anchors, "peer timings JSON to compare against (bench/peers/h200-bf16-peers.json)");
  app.add_option("--json", opt.json_path, "where to write the JSON results")->capture_default_str();
  app.add_flag("--autotune", opt.autotune,
               "time every (path, tactic) candidate per token bucket, keep the fastest that passes the "
               "reference check, save winners to --tuning-cache (buckets already there are not timed)");
  app.add_option("--tuning-cache", opt.tuning_cache,
                 "tuning cache JSON: written by --autotune (default out/tuning.json), else read by the layer");
  bool routing_sweep = false;
  std::string policy_list = "all", expert_list, top_k_list;
  app.add_flag("--routing-sweep", routing_sweep,
               "instead of the layer: time the routing variants (split, fused, cluster) over policies x E x K x T "
               "(--policies, --experts, --top-k, --tokens; defaults: the full sweep grid) and write JSON "
               "for scripts/analyze_routing_sweep.py");
  app.add_option("--policies", policy_list, "routing sweep: routing policies, comma-separated, or 'all'")
      ->capture_default_str();
  app.add_option("--experts", expert_list, "routing sweep: E values, comma-separated (default 8..1024)");
  app.add_option("--top-k", top_k_list, "routing sweep: K values, comma-separated (default 1..32)");
  int deepseek_groups = 8;
  app.add_option("--deepseek-groups", deepseek_groups,
                 "routing sweep: DeepSeekV3's n_group where it fits, topk_group half of it")
      ->capture_default_str()
      ->check(CLI::Range(2, 16));
  bool evict_icache = false;
  app.add_flag("--evict-icache", evict_icache,
               "routing sweep: before each call, run two kernels whose code evicts the SMs' "
               "instruction caches (as the kernels between two layers' calls do); for phase stamps "
               "(cmake -DUNIMOE_ROUTING_STAMPS=ON): the times include those kernels");
  bool stream_patterns = false;
  app.add_flag("--stream-patterns", stream_patterns,
               "instead of the layer: time one read of a weight matrix per access pattern (the decode "
               "GEMMs' loads, bulk copies, a linear read) at the decode GEMMs' sizes and 1 GiB; --iters "
               "reads each");
  bool launch_floor = false;
  app.add_flag("--launch-floor", launch_floor,
               "instead of the layer: time an empty kernel in the decode routing kernels' launch "
               "shapes (one CTA, clusters of 2..16, chains of 2 and 4), as --routing-sweep times "
               "a call; --iters replays");
  std::vector<std::string> dev_list;
  app.add_option("--dev", dev_list,
                 "a development override, name=value (repeatable; the UNIMOE_* variables without "
                 "the prefix, e.g. sorted_pair=0; docs/benchmarking.md lists them)");
  app.add_option("--routing-variant", opt.routing_variant,
                 "auto, split, fused or cluster (BackendOptions::routing_variant)")
      ->check(CLI::IsMember({"auto", "split", "fused", "cluster"}))
      ->capture_default_str();
  FuzzOptions fuzz;
  int fuzz_cases = 0;
  app.add_option("--fuzz", fuzz_cases,
                 "instead of the layer: N random valid layer calls (every policy, shape, backend, "
                 "routing variant, T including 0 and max_tokens, adversarial logits, hostile "
                 "precomputed routing) checked against the CPU reference; without a GPU (or "
                 "with --cpu) the planning slice of the same cases")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", fuzz.seed, "fuzz: the run's seed")->capture_default_str();
  app.add_option("--fuzz-case", fuzz.only_case,
                 "fuzz: rerun one case, SEED:LAYER:CALL as a failure prints it");
  int ep_world = 0;
  app.add_option("--ep", ep_world,
                 "instead of the layer: the expert-parallel layer over NCCL on N GPUs, one forked "
                 "process a GPU, the experts split evenly; each point checked against the CPU "
                 "reference (docs/expert-parallel.md)")
      ->check(CLI::Range(1, EPLayer::kMaxWorldSize));
  CLI11_PARSE(app, argc, argv);
  try {
    opt.dev = DevOverrides::from_environment();
    for (const std::string& d : dev_list) opt.dev.set(d);
    if (evict_icache && !routing_sweep)
      throw Error("evict-icache", "--evict-icache applies to --routing-sweep only");
    const bool other_mode = routing_sweep || stream_patterns || launch_floor || fuzz_cases > 0 ||
                            !fuzz.only_case.empty();
    if (other_mode && !(shapes.config.empty() && shapes.hf_config.empty()))
      throw Error(shapes.config.empty() ? "hf-config" : "config",
                  "gives the layer run its shape; --routing-sweep, --stream-patterns, "
                  "--launch-floor and --fuzz take none");
    if (ep_world > 0) {
      // No CUDA call before the ranks fork.
      if (other_mode) throw Error("ep", "runs alone: drop the other modes");
      EPBenchOptions eo;
      eo.world_size = ep_world;
      if (!quant.empty()) shapes.quant = parse_quant_variant(quant);
      shapes.presets_given = app.count("--preset") > 0;
      eo.shapes = bench_shapes(shapes);
      eo.tokens = parse_counts(token_list, "tokens");
      eo.routing = opt.routing;
      eo.iters = opt.iters;
      eo.check_tokens = opt.check_tokens;
      eo.dev = opt.dev;
      eo.json_path = app.count("--json") > 0 ? opt.json_path : "out/ep.json";
      return run_ep_bench(eo);
    }
    if (fuzz_cases > 0 || !fuzz.only_case.empty()) {
      if (fuzz_cases > 0) fuzz.cases = fuzz_cases;
      fuzz.force_cpu = opt.force_cpu;
      if (app.count("--json") > 0) fuzz.json_path = opt.json_path;
      return run_fuzz(fuzz);
    }
    if (launch_floor) {
      LaunchFloorOptions lo;
      lo.iters = opt.iters;
      lo.pdl = opt.dev.pdl;
      if (app.count("--json") > 0) lo.json_path = opt.json_path;
      return run_launch_floor(lo);
    }
    if (stream_patterns) {
      StreamPatternOptions po;
      po.reads = opt.iters;
      if (app.count("--json") > 0) po.json_path = opt.json_path;
      return run_stream_patterns(po);
    }
    if (routing_sweep) {
      SweepOptions so;
      if (policy_list != "all") {
        so.grid.policies.clear();
        for (const std::string& name : split_list(policy_list))
          so.grid.policies.push_back(parse_routing_policy(name));
      }
      if (!expert_list.empty()) so.grid.experts = parse_counts(expert_list, "experts");
      if (!top_k_list.empty()) so.grid.top_k = parse_counts(top_k_list, "top-k");
      so.grid.deepseek_groups = deepseek_groups;
      if (app.count("--tokens") > 0) so.grid.tokens = parse_counts(token_list, "tokens");
      so.iters = opt.iters;
      so.evict_icache = evict_icache;
      so.dev = opt.dev;
      if (opt.routing_variant != "auto")
        throw Error("routing-variant", "--routing-sweep times every variant; leave it at auto");
      if (app.count("--json") > 0) so.json_path = opt.json_path;
      return run_routing_sweep(so);
    }
    if (!quant.empty()) shapes.quant = parse_quant_variant(quant);
    shapes.presets_given = app.count("--preset") > 0;
    opt.shapes = bench_shapes(shapes);
    for (const Preset& s : opt.shapes)
      if (opt.static_scales && s.config.experts.quant != QuantVariant::FP8PerTensor)
        throw Error("static-scales", "applies to FP8PerTensor only; " + s.name + " is " +
                                         to_string(s.config.experts.quant));
    opt.backends = split_list(backend_list);
    for (const std::string& b : opt.backends) check_backend_name(b);
    opt.tokens = parse_counts(token_list, "tokens");
    if (opt.autotune && opt.tuning_cache.empty()) opt.tuning_cache = "out/tuning.json";
    // A forced backend restricts the candidates, but the cache key is the
    // "auto" config's: its winner must not stand in for the true one.
    if (opt.autotune && opt.backends != std::vector<std::string>{"auto"})
      throw Error("backend", "--autotune tunes the auto backend; leave --backend at auto");
    if (opt.autotune && opt.check_tokens < 1)
      throw Error("check-tokens", "--autotune checks every candidate against the CPU reference: use >= 1");
    std::string why = "--cpu given";
    RunResult result = !opt.force_cpu && gpu_available(&why) ? run_gpu(opt) : run_cpu_reference(opt, why);
    if (result.mode != "gpu" && (opt.autotune || !opt.tuning_cache.empty()))
      result.note += " --autotune and --tuning-cache apply to the GPU layer only: ignored.";
    add_torch_peer(opt, result);
    add_mxfp4_peer(opt, result);
    add_vllm_peer(opt, result);
    add_anchor_peers(opt, result);
    print_table(result);
    write_json(opt, result);
    const long failed = std::count_if(result.points.begin(), result.points.end(),
                                      [](const Point& p) { return p.failed; });
    if (failed > 0) {
      std::fprintf(stderr,
                   "unimoe-bench: FAILED: %ld point(s) over their error bound against the CPU "
                   "reference (rel_err column; docs/benchmarking.md, \"Correctness\")\n",
                   failed);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unimoe-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
