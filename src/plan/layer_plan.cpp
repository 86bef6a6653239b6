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

// The tiled tactic for a schedule's M tile and a GEMM of n_cols output
// columns. 16-row tiles take 64 columns when 128-column tiles would give the
// GEMM at most one CTA per SM. Measured on the H200 (docs/notes.md, session
// 1): at T=1 n64 cut dsv3-tp8's GEMM1 (2I = 512: 32 CTAs at n128) from 46.8
// to 26.1 us and qwen3-30b-a3b's from 19.7 to 15.5 us, but made dsv3-tp8's
// GEMM2 (448 CTAs at n128) slower, 20.3 -> 25.8 us.
GemmTactic tiled_tactic(int tile_m, int n_cols, double tiles, int sm_count) {
  const double ctas_at_n128 = tiles * ((n_cols + 127) / 128);
  const int tile_n = tile_m == 16 && ctas_at_n128 <= sm_count ? 64 : 128;
  for (const GemmTactic& t : kMmaTactics)
    if (!t.stream && t.tile_m == tile_m && t.tile_n == tile_n) return t;
  throw std::runtime_error("no GEMM tactic compiled for m" + std::to_string(tile_m) + "n" +
                           std::to_string(tile_n));
}

// The stream (swap-AB) kernel, for 16-row schedules where the tiled one
// leaves SMs idle or has too little K per CTA. Measured on the H200
// (session 2, run 2: unimoe-bench --autotune at T = 1, 8, 64, every pair of
// 16-row tactics): GEMM1 streamed won only where m16n64 still gave fewer
// CTAs than SMs (dsv3-tp8 T=1: 64 CTAs; layer 46.7 us against 55.9 with
// m16n64) and tied or lost elsewhere (qwen3-30b-a3b T=64: 335 vs 292 us);
// GEMM2 streamed won where its K (= I) is 256 (dsv3-tp8 T=1 and 8, by
// 1.4-2.7 us: the tiled kernel's pipeline has 4 K tiles a CTA) and lost
// for longer K (mixtral T=1: 192 vs 187 us).
constexpr GemmTactic kStream = kMmaTactics[kNumMmaTactics - 1];
static_assert(kStream.stream && kStream.tile_m == 16, "the stream tactic serves 16-row tiles");
constexpr int kStreamGemm2MaxK = 256;

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
  plan.gemm1 = tiled_tactic(plan.tile_m, config.gemm1_cols(), tiles, sm_count);
  plan.gemm2 = tiled_tactic(plan.tile_m, config.experts.hidden, tiles, sm_count);
  if (plan.tile_m == kStream.tile_m) {
    // m16n64 makes a CTA of 32 gated output columns (64 gate and up rows).
    const double ctas_at_n64 = tiles * ((config.gemm1_cols() / 2 + 31) / 32);
    if (ctas_at_n64 < sm_count) plan.gemm1 = kStream;
    if (config.experts.intermediate <= kStreamGemm2MaxK) plan.gemm2 = kStream;
  }
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

namespace {

// Measured on the H200 (session 2, run 1: unimoe-bench with
// UNIMOE_ROUTING_VARIANT=split and =fused, routing + permute stage times):
// fused beats split by 3.5-4.4 us at T = 1 and 8 on every preset (dsv3-tp8
// 11.1 vs 15.2 us, qwen3-30b-a3b 7.1 vs 11.0), and still wins at 128 rows
// (mixtral T=64: 8.9 vs 11.0) and 256 rows (gpt-oss T=64: 11.1 vs 12.2);
// at 512 rows it ties for Renormalize (qwen3-30b-a3b T=64: 13.1 vs 12.9)
// and loses for DeepSeekV3 (dsv3-tp8 T=64: 30.4 vs 17.2), whose per-token
// routing is slow enough that a warp's second token costs more than the
// split kernels; from 1024 rows it loses everywhere (mixtral T=512: 30.6 vs
// 13.1).
constexpr long long kFusedRows = 256;
constexpr int kFusedDeepSeekTokens = 32;  // one token per warp of the fused block

}  // namespace

const char* routing_variant_name(RoutingVariant v) {
  return v == RoutingVariant::Fused ? "fused" : "split";
}

RoutingVariant parse_routing_variant(const std::string& s) {
  if (s == "split") return RoutingVariant::Split;
  if (s == "fused") return RoutingVariant::Fused;
  throw Error("UNIMOE_ROUTING_VARIANT", "is '" + s + "'; allowed: split, fused");
}

RoutingVariant routing_variant_for(const RoutingConfig& routing, int num_tokens) {
  const long long rows = static_cast<long long>(num_tokens) * routing.top_k;
  const bool deepseek = routing.policy == RoutingPolicy::DeepSeekV3 ||
                        routing.policy == RoutingPolicy::MiniMax2;
  if (rows > kFusedRows || (deepseek && num_tokens > kFusedDeepSeekTokens))
    return RoutingVariant::Split;
  return RoutingVariant::Fused;
}

std::string gpu_unsupported_reason(const MoEConfig& config) {
  // The device kernels are BF16 only so far; the CPU reference serves all.
  if (config.experts.quant != QuantVariant::BF16)
    return "quant " + to_string(config.experts.quant) +
           " has no GPU kernels yet; only BF16 runs on the device";
  return "";
}

}  // namespace unimoe
