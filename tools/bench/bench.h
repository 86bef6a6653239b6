// unimoe-bench: shared types of the command-line tool.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "support/floor.h"
#include "support/presets.h"
#include "support/routing_sweep.h"
#include "dev/overrides.h"
#include "unimoe/unimoe.h"

namespace unimoe::bench {

struct Options {
  // The shapes timed, quant variant set (support/shapes.h): presets, or the
  // one config of --config or --hf-config.
  std::vector<Preset> shapes;
  std::vector<int> tokens;
  std::vector<std::string> backends = {"auto"};
  std::string logits_type;   // "F32" or "BF16" for every shape ("" = each shape's own)
  std::string routing = "uniform";  // uniform | skewed
  int iters = 50;
  int rotate = 0;            // input sets rotated through; 0: enough to exceed L2
  int check_tokens = 16;     // tokens checked against the CPU reference per point
  bool force_cpu = false;
  std::string peer_script;   // torch_peer.py to run side by side ("" = none)
  std::string anchors;       // peer timings JSON to compare against ("" = none)
  std::string mxfp4_peer;    // oai_mxfp4_peer.py to run side by side ("" = none)
  std::string vllm_peer;     // vllm_fused_moe_peer.py to run side by side ("" = none)
  std::string json_path = "out/bench.json";
  bool autotune = false;     // tune each (shape, T) bucket not in the cache
  std::string tuning_cache;  // JSON cache of winners ("" = none)
  std::string routing_variant = "auto";  // BackendOptions::routing_variant
  // FP8PerTensor: the activations' static scales given with the weights
  // (support/device_weights.h: kStaticXScale, kStaticActScale), not dynamic.
  bool static_scales = false;
  DevOverrides dev;          // the environment's, then --dev name=value on top
};

struct Point {
  std::string preset;  // the shape's name: a preset's, "config", or a model_type
  std::string backend;
  std::string config;  // MoEConfig::to_string() of what ran
  int tokens = 0;
  double active_experts = 0;
  double time_us = 0;
  FloorEstimate floor;
  std::vector<std::pair<std::string, double>> stage_us;
  std::vector<StageFloor> stage_floor;  // each stage's own floor (GPU runs)
  double rel_err = -1;        // vs the CPU reference (-1: not checked; NaN: broken output)
  double error_bound = -1;    // the quant variant's bound (reference_tolerance); -1: not checked
  bool failed = false;        // checked and over the bound (or NaN): the run exits non-zero
  std::map<std::string, double> peers_us;  // peer name -> time
  std::string choice;                      // the tuned winner (autotune / cache)
  std::string plan;                        // what served the call (GPU): path, tactics, routing
  std::string gemm2_gate;                  // gated GEMM2: the path the gate chose on the last
                                           // timed forward ("combine", "expert"); else empty
  std::map<std::string, int> gemm2_work;   // gated GEMM2: what the gate saw (tiles, rows,
                                           // active, chunks) on that forward
  std::vector<std::string> tuning_log;     // each candidate's time or rejection
};

struct RunResult {
  std::string mode;    // "gpu" or "cpu-reference"
  std::string device;  // GPU name or "cpu"
  std::string note;    // what the reader must know (reduced size, ...)
  Ceilings ceilings;
  std::vector<Point> points;
  std::vector<std::string> peer_rows;  // the peer scripts' JSON lines, as printed
};

// Runs every (shape, T) on the GPU; returns false (and a reason) when no
// usable GPU or no CUDA build.
bool gpu_available(std::string* reason);
// For a GPU-only mode: true with a usable GPU; else prints "unimoe-bench
// <flag> needs a GPU: <reason>" and returns false.
inline bool gpu_or_explain(const char* flag) {
  std::string why;
  if (gpu_available(&why)) return true;
  std::fprintf(stderr, "unimoe-bench %s needs a GPU: %s\n", flag, why.c_str());
  return false;
}
RunResult run_gpu(const Options& opt);
// The CPU reference at a reduced size, for machines without a GPU.
RunResult run_cpu_reference(const Options& opt, const std::string& why);

// Peer timings: torch_peer.py run side by side, anchors read from a file.
void add_torch_peer(const Options& opt, RunResult& result);
void add_anchor_peers(const Options& opt, RunResult& result);
// The MXFP4 peer (bench/peers/oai_mxfp4_peer.py) over the run's presets and
// token counts, once, after unimoe's points: its `us` as peer "oai_mxfp4"
// and `us_incl_routing_metadata` as "oai_mxfp4_meta" beside each point;
// a point the peer could not run is reported on stderr.
void add_mxfp4_peer(const Options& opt, RunResult& result);
// The vLLM Triton peer (bench/peers/vllm_fused_moe_peer.py) over the run's
// presets and token counts, once per quant variant it has (BF16 ->
// bf16, FP8Block128 -> fp8_block, FP8PerTensor -> fp8_tensor; other
// variants and non-preset shapes are skipped with a line on stderr):
// its `us` beside each point as the peer it names (e.g.
// "vllm_fused_moe_fp8_block") and `us_incl_align` as that name + "_align".
// Both peer scripts' lines go to the run's JSON (peer_rows); a point the
// peer could not run is reported on stderr.
void add_vllm_peer(const Options& opt, RunResult& result);

// --routing-sweep: the routing variants over a (policy, E, K, T) grid.
struct SweepOptions {
  RoutingSweepGrid grid = default_routing_sweep_grid();
  int iters = 20;
  std::string json_path = "out/routing_sweep.json";
  // --evict-icache: before each call in the graph, launch_icache_evict
  // (kernels/launch_floor.cuh), so that every call fetches its code from
  // L2 as inside a model; for phase stamps. The times then include the
  // evicting kernels and are no routing times.
  bool evict_icache = false;
  DevOverrides dev;  // the environment's, then --dev name=value on top
};
// Times every point, writes JSON; returns the exit status (2: no GPU,
// 1: the variants disagreed somewhere, 0: done).
int run_routing_sweep(const SweepOptions& opt);

// --stream-patterns: one read of a weight matrix per access pattern
// (kernels/stream_patterns.cuh) at the decode GEMMs' sizes.
struct StreamPatternOptions {
  int reads = 20;
  std::string json_path = "out/stream_patterns.json";
};
// Returns the exit status (2: no GPU, 0: done).
int run_stream_patterns(const StreamPatternOptions& opt);

// --launch-floor: an empty kernel (kernels/launch_floor.cuh) in the decode
// routing kernels' launch shapes, timed as the routing sweep times them.
// unimoe-bench --ep N (ep_bench.cpp): the expert-parallel layer over NCCL,
// one forked process a GPU; each point checked against the CPU reference.
struct EPBenchOptions {
  int world_size = 1;
  std::vector<Preset> shapes;
  std::vector<int> tokens;
  std::string routing = "uniform";
  int iters = 20;
  int check_tokens = 4;
  DevOverrides dev;
  std::string json_path = "out/ep.json";
};
// Forks the ranks (before any CUDA call of this process), waits for them,
// prints the table and writes the JSON; 1 if a point failed its check or a
// rank could not run.
int run_ep_bench(const EPBenchOptions& opt);

struct LaunchFloorOptions {
  int iters = 20;
  bool pdl = true;  // --dev pdl=0 launches without programmatic dependent launch
  std::string json_path = "out/launch_floor.json";
};
// Returns the exit status (2: no GPU, 1: a probe did not run, 0: done).
int run_launch_floor(const LaunchFloorOptions& opt);

// --fuzz: random valid layers and calls against the CPU reference
// (fuzz.cpp; the cases: support/fuzz_cases.h).
struct FuzzOptions {
  int cases = 10000;
  uint64_t seed = 1;
  std::string only_case;  // --fuzz-case SEED:LAYER:CALL: that case alone
  bool force_cpu = false;  // the planning slice even where a GPU exists
  int progress_every = 100;  // layers between progress lines (0: none)
  std::string json_path = "out/fuzz.json";
};
// Returns the exit status (1: a case failed, 0: all passed). Without a GPU
// (or with force_cpu) runs the planning slice and says so.
int run_fuzz(const FuzzOptions& opt);

}  // namespace unimoe::bench
