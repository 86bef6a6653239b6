#include "plan/layer_plan.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "plan/tuning.h"

namespace unimoe {
namespace {

// Rows per local expert above which "auto" takes the Cutlass path. Measured
// on the H200 (bench/results/h200-bf16-mma-vs-cutlass-run1.json, 5 anchor
// shapes x 6 T): the Mma path won every point up to 32 rows per expert but
// one (dsv3-tp8 T=512), the Cutlass path every point from 128 rows up
// (mixtral T=512 by 1.27x, every T=4096 and 16384 by 1.15x-1.8x).
constexpr double kCutlassRowsPerExpert = 96;

// The schedule's M tile for the rows per expert: up to 16 rows, 16-row
// tiles; up to 64, 64-row tiles; above, 128-row tiles (a first rule; only
// the 16-row choice has been compared with the others on the H200).
int tile_m_for(double rows_per_expert) {
  if (rows_per_expert <= 16) return 16;
  if (rows_per_expert <= 64) return 64;
  return 128;
}

// The mma tactic for a schedule's M tile and a GEMM of n_cols output
// columns. 16-row tiles take 64 columns when 128-column tiles would give the
// GEMM at most one CTA per SM. Measured on the H200 (docs/notes.md, session
// 1): at T=1 n64 cut dsv3-tp8's GEMM1 (2I = 512: 32 CTAs at n128) from 46.8
// to 26.1 us and qwen3-30b-a3b's from 19.7 to 15.5 us, but made dsv3-tp8's
// GEMM2 (448 CTAs at n128) slower, 20.3 -> 25.8 us.
GemmTactic tactic_for(int tile_m, int n_cols, double tiles, int sm_count) {
  const double ctas_at_n128 = tiles * ((n_cols + 127) / 128);
  const int tile_n = tile_m == 16 && ctas_at_n128 <= sm_count ? 64 : 128;
  for (const GemmTactic& t : kMmaTactics)
    if (t.tile_m == tile_m && t.tile_n == tile_n) return t;
  throw std::runtime_error("no GEMM tactic compiled for m" + std::to_string(tile_m) + "n" +
                           std::to_string(tile_n));
}

}  // namespace

const char* path_name(ExpertsPath p) { return p == ExpertsPath::Mma ? "mma" : "cutlass"; }

ExpertsPath parse_experts_path(const std::string& s) {
  if (s == "mma") return ExpertsPath::Mma;
  if (s == "cutlass") return ExpertsPath::Cutlass;
  throw Error("path", "unknown experts path '" + s + "'; allowed: mma, cutlass");
}

void check_backend_name(const std::string& name) {
  if (name != "auto" && name != "mma" && name != "cutlass")
    throw Error("options.backend", "unknown backend '" + name + "'; allowed: auto, mma, cutlass");
}

bool backend_allows(const std::string& backend, ExpertsPath p) {
  return backend == "auto" || backend == path_name(p);
}

LayerPlan plan_for_tokens(const MoEConfig& config, int num_tokens, int sm_count,
                          const TuningChoice* tuned) {
  const double rows = static_cast<double>(num_tokens) * config.routing.top_k;
  const int e_local = config.local_experts();
  const double per_expert = rows / e_local;
  const std::string& backend = config.options.backend;
  LayerPlan plan;
  plan.path = backend == "cutlass" || (backend == "auto" && per_expert > kCutlassRowsPerExpert)
                  ? ExpertsPath::Cutlass
                  : ExpertsPath::Mma;
  plan.tile_m = tile_m_for(per_expert);
  // Tiles of the schedule under uniform routing: each expert hit gets
  // ceil(rows / tile_m) tiles.
  const double hit = std::min<double>(e_local, rows);
  const double tiles = hit * std::ceil(rows / std::max(hit, 1.0) / plan.tile_m);
  plan.gemm1 = tactic_for(plan.tile_m, config.gemm1_cols(), tiles, sm_count);
  plan.gemm2 = tactic_for(plan.tile_m, config.experts.hidden, tiles, sm_count);
  if (tuned == nullptr) return plan;

  // A cache entry is keyed with backend "auto" (plan/tuning.h), so a forced
  // backend may meet a winner of the other path: the caller must not pass it.
  if (!backend_allows(backend, tuned->path))
    throw Error("tuning_choice", "'" + tuned->to_string() + "' takes the " +
                                     path_name(tuned->path) + " path; options.backend is '" +
                                     backend + "'");
  plan.path = tuned->path;
  if (tuned->path == ExpertsPath::Cutlass) {
    plan.sm90 = tuned->sm90;
    return plan;
  }
  // GEMM1 and GEMM2 run over one tile schedule, so they share its M tile.
  if (tuned->gemm1.tile_m != tuned->gemm2.tile_m)
    throw Error("tuning_choice",
                "'" + tuned->to_string() + "': gemm1 and gemm2 need the same tile_m");
  plan.tile_m = tuned->gemm1.tile_m;
  plan.gemm1 = tuned->gemm1;
  plan.gemm2 = tuned->gemm2;
  return plan;
}

std::string gpu_unsupported_reason(const MoEConfig& config) {
  // The device kernels are BF16 only so far; the CPU reference serves all.
  if (config.experts.quant != QuantVariant::BF16)
    return "quant " + to_string(config.experts.quant) +
           " has no GPU kernels yet; only BF16 runs on the device";
  return "";
}

}  // namespace unimoe
