#include "plan/layer_plan.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/routing_launch_shape.h"
#include "plan/tuning.h"

namespace unimoe {
namespace {

// Rows per local expert above which "auto" takes the Cutlass path. Measured
// on an H200 (5 anchor shapes x 6 T): the Mma path won every point up to 32
// rows per expert but one (dsv3-tp8 T=512, 16 rows, which the Mma path's
// m32n64 tile wins: 781.7 us against 809.0 for the best CUTLASS tactic), the
// Cutlass path every point from 128 rows up (mixtral T=512 by 1.27x, every
// T=4096 and 16384 by 1.15x-1.8x).
constexpr double kCutlassRowsPerExpert = 96;

// The Cutlass path's tile: 128x256x64 cooperative. Measured on an H200
// with unimoe-bench --autotune (bench/results/h200/autotune-table.txt): it
// won every point the path wins, T = 4096 and 16384 on all five anchor
// shapes and mixtral-8x7b T=512, by 9-22% over 128x128x64 (dsv3-tp8
// T=16384 4363 against 4829 us, qwen3-30b-a3b T=4096 785 against 905,
// mixtral T=512 1161 against 1379); pingpong 64x128x64 won only below the
// path's crossover (dsv3-tp8 T=512).
constexpr Sm90GemmTactic kCutlassTactic = Sm90GemmTactic::Cooperative128x256;

// The rest of the rule, for the Mma path, measured on an H200 with
// unimoe-bench --autotune (every pair of tactics sharing an M tile, layer
// time by graph replay):
//
// M tile: 16-row tiles up to 8 rows per expert (mixtral-8x7b T=8, 8 rows:
// m16n64 493 us against m64n128 565; at 16 rows they lose: mixtral T=64
// m64n128 727 us against m16n64 829). 32-row tiles above 8 up to 16 rows
// (16 rows: mixtral T=64 m32n64 742.2 us against m64n128 763.6; dsv3-tp8
// T=512 781.7 against m64n128 848.2 and 809.0 for the best CUTLASS
// tactic). 48-row tiles above 16 up to 36 rows, 64-row tiles above 36 up
// to 64. --autotune over every pair at 32 rows: qwen3-30b-a3b T=512
// m48n128 346.9 us against m64n128 364.7, the best m32 pair 372.2 and the
// best CUTLASS tactic 364.1; qwen3-235b-a22b T=512 1255.6 against m64n128
// 1288.3. m48n128 against m64n128 (us, 48/64) at 24, 32, 40, 48 and 56
// rows: qwen3-30b-a3b 340.9/361.3, 345.5/364.5,
// 360.7/369.6, 391.4/374.0, 451.0/396.1; mixtral-8x7b 735.0/785.6,
// 741.5/783.6, 812.6/797.8, 904.0/801.4, 1230.5/885.8. The 48-row tile wins
// while few experts pass 48 rows (each such expert takes a second tile);
// the bound lies between the split point (40) and the last common win (32).
// 128-row tiles above 64 rows (not compared with 64-row tiles on an H200).
constexpr double kTile16RowsPerExpert = 8;
constexpr double kTile32RowsPerExpert = 16;
constexpr double kTile48RowsPerExpert = 36;
constexpr double kTile64RowsPerExpert = 64;

int tile_m_for(double rows_per_expert) {
  if (rows_per_expert <= kTile16RowsPerExpert) return 16;
  if (rows_per_expert <= kTile32RowsPerExpert) return 32;
  if (rows_per_expert <= kTile48RowsPerExpert) return 48;
  if (rows_per_expert <= kTile64RowsPerExpert) return 64;
  return 128;
}

// Column tile: with 16-row tiles, 64 columns won every measured point over
// 128 (T=8: qwen3-30b-a3b 129 vs 137 us, qwen3-235b-a22b 455 vs 466,
// gpt-oss-120b 335 vs 345, mixtral 493 vs 512; T=1 and T=64 likewise or
// tied): more CTAs for the same weights. 32-row tiles take 64 (the only
// 32-row tile compiled, in two builds: m32n64 and m32n64x5); larger M tiles
// (48, 64, 128) take 128.
GemmTactic tiled_tactic(int tile_m, int ctas_per_sm = 0) {
  const int tile_n = tile_m <= 32 ? 64 : 128;
  for (const GemmTactic& t : kMmaTactics)
    if (!t.stream && !t.wgmma && t.tile_m == tile_m && t.tile_n == tile_n && t.ctas_per_sm == ctas_per_sm)
      return t;
  throw std::runtime_error("no GEMM tactic compiled for " +
                           GemmTactic{tile_m, tile_n, false, ctas_per_sm}.to_string());
}

// GEMM2 over 32-row tiles takes m32n64x5 (3 pipeline stages, 5 CTAs an SM)
// and GEMM1 the standard m32n64 (6 stages, 3 an SM). Measured on an H200
// (every 32-row point of the anchor shapes, both builds of the tile for
// both GEMMs):
// - GEMM2 gained at every point but one. mixtral-8x7b T=64 (N = 4096, 512
//   CTAs: 1.3 waves at 3 an SM, one at 5): 284 -> 227 us. dsv3-tp8 T=512
//   (K = 256, four K steps a CTA): 291 -> 246. gpt-oss-120b T=512 (14.5
//   waves of long CTAs) lost 513 -> 522.
// - GEMM1 lost at all three (mixtral 445 -> 458, dsv3-tp8 452 -> 484,
//   gpt-oss-120b 999 -> 1025): with many waves the deeper pipeline pays.
// The pair as the rule takes it, on a second H200: mixtral-8x7b T=64
// 680.7 us, against 729-730 for m32n64 on both GEMMs in the measurement
// above.
constexpr int kGemm2CtasPerSm32 = 5;

// The stream (swap-AB) kernel for both GEMMs
//  - where I <= 256 and experts have at most one row: there the tiled
//    kernels have few column blocks (GEMM1, 2I = 512 columns) or few K tiles
//    a CTA (GEMM2, K = I), and the stream kernel's many short CTAs keep every
//    SM streaming. dsv3-tp8 (H200): T=1 41.5 us against 51.0 for m16n64;
//    T=8 173.9 against 187.7; at 2 rows per expert (T=64) the two tied.
//  - at any I up to half a row per expert, where nearly every tile has one
//    row and takes the stream kernel's one-token path (512-byte row loads).
//    H200, layer time of stream against m16n64 at T = 1, 2, 4, 8, 16:
//    mixtral-8x7b (T/4 rows per expert) -9, -4, -3.4, +1.9, 0%;
//    qwen3-30b-a3b (T/16) 0, -2.5, -2.6, -0.5, +3.1%; qwen3-235b-a22b (T/16)
//    -4.2, -4.1, -4.7, -2.8, +0.9%; gpt-oss-120b (T/32) +3.6 (-1.3 with the
//    GEMM1/GEMM2 overlap), -0.7, -1.0, +0.4, +3.1%. At one row per expert
//    the multi-row tiles lose (qwen3 T=16); mixtral T=4 is the one win missed.
constexpr GemmTactic kStream = kMmaTactics[kNumMmaTactics - 1];
static_assert(kStream.stream && kStream.tile_m == 16, "the stream tactic serves 16-row tiles");
constexpr int kStreamMaxIntermediate = 256;
constexpr double kStreamRowsPerExpert = 1;
constexpr double kStreamAnyIRowsPerExpert = 0.5;

// The stream path's GEMM1 -> GEMM2 overlap (LayerPlan::overlap_stream_gemms)
// up to this I. Measured on an H200, stream backend, on against off
// (UNIMOE_STREAM_OVERLAP=0): dsv3-tp8 (I = 256) T=1 33.0 against 33.5 us,
// qwen3-30b-a3b (768) 29.2 against 29.5, gpt-oss-120b (2880) 58.3 against
// 59.0; mixtral-8x7b (14336) lost, 169 against 166 at T=1 and 530 against
// 519 at T=8: its GEMM2 is long, and its early CTAs only take slots from
// GEMM1's last wave.
constexpr int kOverlapMaxIntermediate = 4096;

// FP8 experts run on two paths: the FP8 stream kernel up to this many rows
// per local expert (one 16-row tile each, so each active expert's weights
// are read about once), CUTLASS's blockwise-scaled grouped GEMM above.
// Measured on an H100, FP8Block128, each path forced (us, stream against
// cutlass): at 2 rows an expert dsv3-tp8 T=64 484.6 against 493.6,
// qwen3-30b-a3b T=32 209.8 against 217.8, qwen3-235b-a22b T=32 771.9
// against 746.0; at 4, 576.0 against 563.4, 245.8 against 245.9, 909.2
// against 852.2; at 1 and 0.5 the stream path won by 4-14%
// (bench/results/h100/layer-fp8.txt, Part 9). `unimoe-bench --autotune`
// times both paths per bucket.
constexpr double kFp8StreamRowsPerExpert = 2;

// The FP8 Cutlass path's tile: 64-row pingpong while experts hold few rows
// (most of a 128-row tile would be padding), 128x128 cooperative from 64
// rows per expert on average, one tile for both GEMMs. Measured on an H100
// against each GEMM on the other tile (fp8_tactic, 12 points at T = 512,
// 4096, 16384 of four presets): the rule's pair was the faster or within 1%
// everywhere (bench/results/h100/layer-fp8.txt, Part 7).
constexpr double kFp8WideTileRowsPerExpert = 64;

bool is_fp8(QuantVariant q) {
  return q == QuantVariant::FP8Block128 || q == QuantVariant::FP8PerTensor;
}

bool is_w4(QuantVariant q) { return q == QuantVariant::MXFP4 || q == QuantVariant::NVFP4; }

// The 4-bit stream kernel's M tile: 64-row tiles (its rows form: the CTA
// stages the tile's token rows in shared memory, each dequantized weight
// serves every row) from this many rows per local expert, 16-row tiles
// below. Measured on an H100, whole layer, MXFP4, 64-row against 16-row
// tiles: at 16 and 32 rows an expert it won every point (T=512:
// gpt-oss-120b 1153.7 against 1860.0 us, dsv3-tp8 638.7 against 864.6,
// qwen3-30b-a3b 338.0 against 620.7); at 2 and 4 (T=64) it was mixed
// (801.0 against 917.4, 408.9 against 421.1, qwen3-30b-a3b 202.8 against
// 193.1), so the bound sits at the first measured win.
constexpr double kW4RowsTileRowsPerExpert = 16;
constexpr int kW4RowsTileM = 64;  // w4_rows_tile_m (kernels/gemm/stream_gemm_w4.cuh)

// The stream path's M tile: 16, or for 4-bit weights the rule above.
int w4_stream_tile_m(const MoEConfig& config, double per_expert) {
  return is_w4(config.experts.quant) && per_expert >= kW4RowsTileRowsPerExpert ? kW4RowsTileM
                                                                                : kStream.tile_m;
}

}  // namespace

const char* path_name(ExpertsPath p) {
  switch (p) {
    case ExpertsPath::Mma: return "mma";
    case ExpertsPath::Cutlass: return "cutlass";
    case ExpertsPath::Stream: return "stream";
  }
  return "?";
}

namespace {

std::string path_names() {
  std::string names;
  for (ExpertsPath p : kExpertsPaths) names += std::string(names.empty() ? "" : ", ") + path_name(p);
  return names;
}

}  // namespace

ExpertsPath parse_experts_path(const std::string& s) {
  for (ExpertsPath p : kExpertsPaths)
    if (s == path_name(p)) return p;
  throw Error("path", "unknown experts path '" + s + "'; allowed: " + path_names());
}

void check_backend_name(const std::string& name) {
  if (name == "auto") return;
  for (ExpertsPath p : kExpertsPaths)
    if (name == path_name(p)) return;
  throw Error("options.backend", "unknown backend '" + name + "'; allowed: auto, " + path_names());
}

std::string backend_unsupported_reason(ExpertsPath p, const MoEConfig& config,
                                       const DeviceArch& arch) {
  // Every backend has the layer's rules (gpu_unsupported_reason) and is
  // compiled for sm_90a only. What each needs of the shapes (K and output
  // columns in multiples of 8 for 16-byte loads and TMA rows, 128 for the
  // FP8 GEMMs' scale blocks) the layer's rules and validate() already ask.
  if (const std::string why = gpu_unsupported_reason(config); !why.empty())
    return std::string(path_name(p)) + ": " + why;
  // The 4-bit variants have one kernel so far, the W4A16 stream GEMM.
  if (p != ExpertsPath::Stream && is_w4(config.experts.quant))
    return std::string(path_name(p)) + ": " + to_string(config.experts.quant) +
           " runs on the stream path only (no W4A16 kernel of this path yet)";
  if (arch.major != 9 || arch.minor != 0)
    return std::string(path_name(p)) + ": the kernels are built for sm_90a (Hopper); this device is sm_" +
           std::to_string(arch.major) + std::to_string(arch.minor);
  return "";
}

std::string LayerPlan::to_string() const {
  std::string s = std::string("path=") + path_name(path);
  if (path == ExpertsPath::Cutlass)
    return s + " sm90=" +
           (!fp8                       ? unimoe::to_string(sm90)
            : sm90_fp8 == sm90_fp8_gemm2 ? std::string(unimoe::to_string(sm90_fp8))
                                         : std::string(unimoe::to_string(sm90_fp8)) + ":" +
                                               unimoe::to_string(sm90_fp8_gemm2));
  s += " tile_m=" + std::to_string(tile_m) + " gemm1=" + gemm1.to_string() +
       " gemm2=" + gemm2.to_string();
  if (gemm2_mode != Gemm2Mode::Expert) s += std::string(" gemm2_path=") + gemm2_mode_name(gemm2_mode);
  return s;
}

bool backend_allows(const std::string& backend, ExpertsPath p) {
  return backend == "auto" || backend == path_name(p);
}

LayerPlan plan_for_tokens(const MoEConfig& config, int num_tokens,
                          const TuningChoice* tuned) {
  const double rows = static_cast<double>(num_tokens) * config.routing.top_k;
  const int e_local = config.local_experts();
  const double per_expert = rows / e_local;
  const std::string& backend = config.options.backend;
  LayerPlan plan;
  const bool stream_rule = per_expert <= kStreamAnyIRowsPerExpert ||
                           (config.experts.intermediate <= kStreamMaxIntermediate &&
                            per_expert <= kStreamRowsPerExpert);
  if (backend == "auto" && is_w4(config.experts.quant))
    plan.path = ExpertsPath::Stream;  // the only W4A16 path so far
  else if (backend == "auto" && is_fp8(config.experts.quant))
    plan.path = per_expert > kFp8StreamRowsPerExpert ? ExpertsPath::Cutlass : ExpertsPath::Stream;
  else if (backend == "auto")
    plan.path = per_expert > kCutlassRowsPerExpert ? ExpertsPath::Cutlass
                : stream_rule                      ? ExpertsPath::Stream
                                                   : ExpertsPath::Mma;
  else
    plan.path = parse_experts_path(backend);
  plan.sm90 = kCutlassTactic;
  plan.fp8 = is_fp8(config.experts.quant);
  plan.sm90_fp8 = per_expert < kFp8WideTileRowsPerExpert ? Sm90Fp8GemmTactic::Pingpong64x128
                                                         : Sm90Fp8GemmTactic::Cooperative128x128;
  plan.sm90_fp8_gemm2 = plan.sm90_fp8;
  if (plan.path == ExpertsPath::Stream) {
    plan.tile_m = w4_stream_tile_m(config, per_expert);
    plan.gemm1 = plan.gemm2 = kStream;
  } else if (plan.fp8 && plan.path == ExpertsPath::Mma) {
    plan.tile_m = kFp8MmaTactic.tile_m;
    plan.gemm1 = plan.gemm2 = kFp8MmaTactic;
  } else {
    plan.tile_m = tile_m_for(per_expert);
    plan.gemm1 = tiled_tactic(plan.tile_m);
    plan.gemm2 = tiled_tactic(plan.tile_m, plan.tile_m == 32 ? kGemm2CtasPerSm32 : 0);
  }
  const bool overlap_allowed = config.experts.intermediate <= kOverlapMaxIntermediate;
  plan.overlap_stream_gemms = plan.path == ExpertsPath::Stream && overlap_allowed;
  if (tuned == nullptr) return plan;

  // A cache entry is keyed with backend "auto" (plan/tuning.h), so a forced
  // backend may meet a winner of the other path: the caller must not pass it.
  if (!backend_allows(backend, tuned->path))
    throw Error("tuning_choice", "'" + tuned->to_string() + "' takes the " +
                                     path_name(tuned->path) + " path; options.backend is '" +
                                     backend + "'");
  check_choice_tactics(*tuned);
  plan.path = tuned->path;
  plan.overlap_stream_gemms = plan.path == ExpertsPath::Stream && overlap_allowed;
  if (tuned->path == ExpertsPath::Cutlass) {
    plan.sm90 = tuned->sm90;
    return plan;
  }
  plan.tile_m = tuned->path == ExpertsPath::Stream ? w4_stream_tile_m(config, per_expert)
                                                   : tuned->gemm1.tile_m;
  plan.gemm1 = tuned->gemm1;
  plan.gemm2 = tuned->gemm2;
  return plan;
}

void check_choice_tactics(const TuningChoice& c) {
  auto refuse = [&](const std::string& why) {
    throw Error("tuning_choice", "'" + c.to_string() + "': " + why);
  };
  switch (c.path) {
    case ExpertsPath::Cutlass:
      return;
    case ExpertsPath::Stream:
      if (c.gemm1 != kStream || c.gemm2 != kStream)
        refuse(std::string("the stream path runs ") + kStream.to_string() + " for both GEMMs");
      return;
    case ExpertsPath::Mma:
      if (c.gemm1.stream || c.gemm2.stream)
        refuse("the mma path runs tiled tactics; " + kStream.to_string() + " is the stream path's");
      // GEMM1 and GEMM2 run over one tile schedule, so they share its M tile.
      if (c.gemm1.tile_m != c.gemm2.tile_m) refuse("gemm1 and gemm2 need the same tile_m");
      return;
  }
}

namespace {

// Measured on an H200 by the routing sweep (unimoe-bench --routing-sweep:
// 17,980 points, every policy x E in 8..1024 x K in 1..32 x T in 1..16384,
// split, fused and cluster each timed 8 calls to a graph replay). The limits
// were fitted by scripts/analyze_routing_sweep.py ("proposed per family":
// every limit fitted for the DeepSeek policies and for the others apart) on
// a sweep of the cluster kernel in which CTA 0 permutes while the other CTAs
// weigh their experts (src/kernels/routing/). Facts the limits encode
// (figures of that sweep):
// - The cluster variant serves every small call. Where one routing CTA is
//   enough (T up to its minimum tokens a CTA, 1 to 4:
//   routing_shape::cluster_min_tokens_by_default) it launches the fused
//   block itself, so no limit needs the fused variant: fitted with one, its best
//   limits were T <= 0. Beyond, the cluster's permuting CTA no longer waits
//   for the weights: DeepSeekV3 E=256 K=8 T=5 cluster 5.38 us vs fused 7.57,
//   T=64 8.08 vs split 10.75; Renormalize E=128 K=8 T=8 3.84 vs fused 4.68.
// - Split from T*K > 1536 or T*E above 49152 (DeepSeek) / 65536 (the
//   others), or T above 128 / 256: there the split chain's parallelism (a
//   warp per token over the whole GPU, a multi-CTA permute) pays, while the
//   cluster had 8 CTAs at most in that sweep. DeepSeekV3 E=256 K=8 T=128
//   cluster 10.94 us vs split 10.89, T=256 17.51 vs 11.15.
// Within 5% of the best variant on 98.3% of that sweep's points (in sample;
// refitted without each E value and scored on it, 98.3%, worst E=256 at
// 95.0%; without each policy, 98.3%, worst Llama4 at 95.7%); 1.53x over
// always-fused, 1.55x over always-split, 1.07x over always-cluster
// (geometric means). A rule that sends T <= 12 (8 for DeepSeek) to the
// fused block scored 84.1% on the same points.
struct RoutingLimits {
  long long cluster_rows;  // T*K
  int cluster_tokens;
  long long cluster_scores;  // T*E
};
// Refitted on a sweep with clusters of 16 for the DeepSeek policies from
// E = 128 and the others from E = 256
// (routing_shape::cluster_max_ctas_by_default): with them the cluster
// variant wins further, so T*K up to 3072 (DeepSeek) / 2048 and T*E up to
// 65536 / 131072 (e.g. Renormalize E=64 K=22 T=96 and E=512 K=16 T=128,
// where split takes 1.36-1.44x the cluster's time). On that sweep's points:
// 98.4% within 5% (the limits fitted without clusters of 16: 97.4%);
// refitted without each E value and scored on it, 97.0-99.6% (E=1024 94.7%
// with its own refit, 97.2% with these limits). On the current sweep
// (bench/results/h200/routing-sweep.txt) the rule is within 5% of the best
// variant on 99.0% of the points.
constexpr RoutingLimits kDeepSeekLimits{3072, 128, 65536};
constexpr RoutingLimits kOtherLimits{2048, 256, 131072};

// Beyond those limits, the cluster variant's spread kernel
// (routing_shape::spread_shape; every CTA of a cluster of up to 16 places
// its own rows) up to kSpreadRuleMaxTokens where the cluster variant takes
// it (routing_shape::spread_by_default; E_local taken as E, 16 CTAs: the
// H200's largest cluster of it, and the CTA-0 kernel's clusters as the
// H200 runs them). Measured on an H200
// (DeepSeekV3/Renormalize/TopK, E 64..384, K 1/4/8, T 128..384, a less
// tuned form of the spread kernel against split): 0.58-0.95 of split's
// time wherever it serves (DeepSeekV3 E=256 K=8 T=192 7.88 us vs 10.29,
// T=384 10.68 vs 11.33; Renormalize E=128 K=8 T=256 5.42 vs ~8.3); the
// present kernel is faster still (DeepSeekV3 E=256 K=8 T=256 7.82 us,
// T=192 7.12). At E=384 it does not serve from T=192 (the CTA-0 kernels then
// lose to split, up to 2x). T=512 was measured too, but no K=8 call of it
// is served (32 tokens a CTA leave no permuting warp).
constexpr int kSpreadRuleMaxTokens = 384;

bool spread_serves(const RoutingConfig& routing, int num_tokens, bool deepseek) {
  if (num_tokens > kSpreadRuleMaxTokens) return false;
  const int e = routing.num_experts;
  const routing_shape::SpreadShape shape = routing_shape::spread_shape(
      routing_shape::slots_for_experts(e), num_tokens, e, e, deepseek,
      routing_shape::default_spread_min_tokens(deepseek), routing_shape::kSpreadMaxCtas);
  return routing_shape::spread_by_default(shape, num_tokens, routing.top_k, e, e, deepseek,
                                          routing_shape::cluster_max_ctas_by_default(deepseek, e));
}

}  // namespace

LayerPlan plan_layer(const MoEConfig& config, int num_tokens, bool precomputed,
                     const RoutingDeviceCaps& caps, const DevOverrides& dev,
                     const TuningChoice* tuned) {
  LayerPlan plan = plan_for_tokens(config, std::max(num_tokens, 1), tuned);
  plan.overlap_stream_gemms = plan.overlap_stream_gemms && dev.stream_overlap;
  plan.pdl = dev.pdl;
  plan.read_before_wait = dev.stream_overlap;
  plan.stream_max_splits = dev.stream_max_splits;
  plan.stream_one_token = dev.stream_one_token;
  plan.next_prefetch = dev.next_prefetch;
  plan.fp8_wide_ctas = dev.fp8_wide_ctas;
  plan.fp8_quant_early = dev.fp8_quant_early;
  plan.fp8_act_quant_fused = dev.fp8_act_quant_fused;
  plan.fp8_quant_scatter = dev.fp8_quant_scatter;
  plan.row_scatter = dev.row_scatter;
  plan.w4_pipeline = dev.w4_pipeline;
  plan.fp8_quant_in_gemm =
      dev.fp8_quant_in_gemm && plan.fp8 && plan.path == ExpertsPath::Stream && num_tokens == 1;
  plan.fp8_tensor_scale_first = dev.fp8_tensor_scale_first;
  if (is_w4(config.experts.quant) && plan.path == ExpertsPath::Stream && dev.w4_tile_m != 0)
    plan.tile_m = dev.w4_tile_m;
  if (plan.fp8 && plan.path == ExpertsPath::Cutlass && !dev.fp8_tactic.empty()) {
    // DevOverrides::set checked both names.
    const std::size_t colon = dev.fp8_tactic.find(':');
    plan.sm90_fp8 = parse_sm90_fp8_gemm_tactic(dev.fp8_tactic.substr(0, colon));
    plan.sm90_fp8_gemm2 = colon == std::string::npos
                              ? plan.sm90_fp8
                              : parse_sm90_fp8_gemm_tactic(dev.fp8_tactic.substr(colon + 1));
  }
  if (plan.path == ExpertsPath::Mma && !dev.mma_tactic.empty()) {
    // DevOverrides::set checked the pair: tiled tactics of one tile_m.
    const std::size_t colon = dev.mma_tactic.find(':');
    plan.gemm1 = parse_gemm_tactic(dev.mma_tactic.substr(0, colon));
    plan.gemm2 = colon == std::string::npos ? plan.gemm1 : parse_gemm_tactic(dev.mma_tactic.substr(colon + 1));
    plan.tile_m = plan.gemm1.tile_m;
  }
  plan.gemm2_mode = gemm2_mode_for(config, num_tokens, plan.path, dev);
  // The FP8 stream kernel and the 4-bit 16-row form fold the finalize (not
  // the 4-bit rows and wgmma forms, nor the FP8 mma path).
  plan.finalize_in_gemm2 =
      num_tokens >= 1 && num_tokens <= dev.finalize_in_gemm2 && plan.path == ExpertsPath::Stream &&
      plan.gemm2_mode == Gemm2Mode::Expert &&
      (plan.fp8 || (is_w4(config.experts.quant) && plan.tile_m == kStream.tile_m));
  plan.routing = plan_routing(config, num_tokens, precomputed, caps, dev);
  return plan;
}

Gemm2Mode gemm2_mode_for(const MoEConfig& config, int num_tokens, ExpertsPath path,
                         const DevOverrides& dev) {
  if (path == ExpertsPath::Cutlass || !combine_serves(config, num_tokens)) return Gemm2Mode::Expert;
  switch (dev.gemm2_path) {
    case DevGemm2Path::kExpert: return Gemm2Mode::Expert;
    case DevGemm2Path::kCombine: return Gemm2Mode::Combine;
    case DevGemm2Path::kGate: return Gemm2Mode::Gate;
    case DevGemm2Path::kRule: break;
  }
  // The rule keeps the expert path until a sweep of the forced paths shows
  // the gate never slower than it (docs/gemm2-gate.md, "Measuring it"): the
  // gate is opt-in through gemm2_path=gate until then.
  return Gemm2Mode::Expert;
}

RoutingVariant routing_variant_for(const RoutingConfig& routing, int num_tokens) {
  const long long t = num_tokens;
  const long long rows = t * routing.top_k, scores = t * routing.num_experts;
  const bool deepseek =
      routing.policy == RoutingPolicy::DeepSeekV3 || routing.policy == RoutingPolicy::MiniMax2;
  const RoutingLimits& l = deepseek ? kDeepSeekLimits : kOtherLimits;
  if (rows <= l.cluster_rows && t <= l.cluster_tokens && scores <= l.cluster_scores)
    return RoutingVariant::Cluster;
  if (spread_serves(routing, num_tokens, deepseek)) return RoutingVariant::Cluster;
  return RoutingVariant::Split;
}

std::string gpu_unsupported_reason(const MoEConfig& config) {
  const QuantVariant q = config.experts.quant;
  // The W4A16 kernel loads 16 bytes (32 values) of a weight row at a time:
  // H and I must be multiples of 32. validate() already asks it of MXFP4;
  // NVFP4's format alone needs only 16.
  if (q == QuantVariant::NVFP4 &&
      (config.experts.hidden % 32 != 0 || config.experts.intermediate % 32 != 0))
    return "NVFP4 on the GPU needs hidden and intermediate multiples of 32 (the W4A16 kernel "
           "loads 32 values of a row at a time); got hidden=" +
           std::to_string(config.experts.hidden) +
           " intermediate=" + std::to_string(config.experts.intermediate);
  // The FP8 GEMMs take one scale per 128-wide K block (FP8PerTensor's one
  // scale is broadcast to them), and quantize each GEMM input per 128
  // columns: H and I must be multiples of 128. validate() already asks it
  // of FP8Block128; FP8PerTensor's format alone needs only 16.
  const int m = gpu_shape_multiple(q);
  if (q == QuantVariant::FP8PerTensor &&
      (config.experts.hidden % m != 0 || config.experts.intermediate % m != 0))
    return "FP8PerTensor on the GPU needs hidden and intermediate multiples of 128 (the FP8 "
           "GEMMs scale per 128-wide K block); got hidden=" +
           std::to_string(config.experts.hidden) +
           " intermediate=" + std::to_string(config.experts.intermediate);
  return "";
}

int gpu_shape_multiple(QuantVariant q) { return is_fp8(q) ? 128 : is_w4(q) ? 32 : 1; }

}  // namespace unimoe
