// The host-side plan of the GPU layer: which experts path serves a call of
// T tokens and with which tiles, and whether the device can serve a config
// at all. Pure host code, tested on the CPU (tests/cpu/test_layer_plan.cpp).
#pragma once

#include <string>

#include "core/tactics.h"
#include "plan/gemm2_gate.h"
#include "plan/routing_plan.h"
#include "unimoe/unimoe.h"

namespace unimoe {

// The backends: three ways the experts stages run, behind one plan (and one
// C++ interface on the device side, ExpertsBackend in layer/experts_backend.h).
//   Mma: mma.sync grouped GEMMs over a tile schedule, CTA tiles staged
//        through a cp.async pipeline in shared memory, x gathered on load,
//        bias and activation in GEMM1's epilogue, b2 in GEMM2's; GEMM1 and
//        GEMM2 tactics chosen separately;
//   Cutlass: CUTLASS's Hopper grouped GEMM (TMA, wgmma, warp-specialized)
//        over contiguous permuted rows: gather kernel, GEMM1, activation
//        kernel, GEMM2, b2 added by the finalize;
//   Stream: the swap-AB decode kernel (weights on the MMA's M side, loaded
//        from HBM straight into registers, K split across a CTA's warps),
//        over 16-row tiles, with Mma's gather-on-load and epilogues.
enum class ExpertsPath { Mma, Cutlass, Stream };
inline constexpr ExpertsPath kExpertsPaths[] = {ExpertsPath::Mma, ExpertsPath::Cutlass,
                                                ExpertsPath::Stream};
// "mma", "cutlass", "stream".
const char* path_name(ExpertsPath p);
// The name back; throws Error (field "path") naming the allowed values.
ExpertsPath parse_experts_path(const std::string& s);
// "auto" or a path name; throws Error (field "options.backend") naming the
// allowed values.
void check_backend_name(const std::string& name);
// Whether options.backend `backend` lets path `p` serve: "auto" lets all.
bool backend_allows(const std::string& backend, ExpertsPath p);

// What a backend's legality depends on besides the config.
struct DeviceArch {
  int major = 0;  // compute capability
  int minor = 0;
  int sm_count = 0;
};

// Empty when backend `p` can serve `config` on `arch`, else the rule that
// failed (ExpertsBackend::supports answers with it; MoELayer::create checks
// a forced backend; the rule and the tuner only offer backends that serve).
std::string backend_unsupported_reason(ExpertsPath p, const MoEConfig& config,
                                       const DeviceArch& arch);

struct TuningChoice;  // plan/tuning.h

// The host-side plan for one call size.
struct LayerPlan {
  ExpertsPath path = ExpertsPath::Mma;
  int tile_m = 0;       // the schedule's M tile (Mma and Stream paths)
  GemmTactic gemm1;     // Mma path tactics; the stream tactic on the Stream path
  GemmTactic gemm2;
  Sm90GemmTactic sm90 = Sm90GemmTactic::Cooperative128x128;  // Cutlass path tactic (BF16)
  // The FP8 variants' Cutlass path: its blockwise-scaled GEMMs' tiles,
  // GEMM1's and GEMM2's.
  bool fp8 = false;
  Sm90Fp8GemmTactic sm90_fp8 = Sm90Fp8GemmTactic::Cooperative128x128;
  Sm90Fp8GemmTactic sm90_fp8_gemm2 = Sm90Fp8GemmTactic::Cooperative128x128;
  // Stream path: GEMM1 lets GEMM2 launch once its loads are done, and GEMM2
  // issues its first weight loads before waiting for GEMM1 (a launch
  // detail, not in to_string; layer_plan.cpp has the measurements).
  bool overlap_stream_gemms = false;
  // Launch details that development overrides may change (plan_layer sets
  // them; plan_for_tokens leaves the defaults): programmatic dependent
  // launch on every kernel; the finalize reading the routing outputs (and
  // a stream GEMM2 its schedule) before its PDL wait; the stream kernel's
  // K-split cap (0: the rule) and its one-token path.
  bool pdl = true;
  bool read_before_wait = true;
  int stream_max_splits = 0;
  bool stream_one_token = true;
  // The FP8 stream path's GEMM1 fetches GEMM2's weights of the call's
  // experts into L2 where they fit (common.cuh, NextWeightsPrefetch).
  bool next_prefetch = true;
  // The FP8 stream kernel may give a CTA two column blocks where that fits
  // the grid in one wave (stream_gemm_fp8_config.h).
  bool fp8_wide_ctas = true;
  // The FP8 stream path's quantize kernels (x, the activation) let the GEMM
  // after them launch once their wait is over, in decode-sized grids
  // (fp8_quant.cuh, early_dependents).
  bool fp8_quant_early = true;
  // FP8Block128's cutlass path quantizes the activation in the activation
  // kernel (expert_rows.cuh, launch_gated_activation_fp8).
  bool fp8_act_quant_fused = true;
  // ... and writes x's codes and scales straight to the permuted rows
  // (fp8_quant.cuh, launch_quantize_fp8_rows_scatter), with no gather.
  bool fp8_quant_scatter = true;
  // BF16's cutlass path writes each token's x row to its permuted rows
  // (launch_scatter_rows: one read of x a token) instead of gathering them
  // (launch_gather_rows: one read a permuted row); the same rows.
  bool row_scatter = true;
  // The 4-bit stream GEMM's 16-row form refills each slot of its register
  // load ring right after the slot's math (stream_gemm_w4.cu, run_tile).
  bool w4_pipeline = false;
  // The FP8 stream path at one token: GEMM1 quantizes x and GEMM2 the
  // activation as they read them (stream_gemm_fp8.cuh, a_bf16 / a_f32),
  // with no quantize kernel between (FP8PerTensor's dynamic activation
  // scale from GEMM1's CTAs' output maxima, out_maxima).
  bool fp8_quant_in_gemm = false;
  // The FP8 and 4-bit stream paths' GEMM2 folds the finalize into the CTAs
  // that complete each column block (FinalizeFold, kernels/gemm/
  // grouped_gemm.cuh): no finalize kernel after it.
  bool finalize_in_gemm2 = false;
  // FP8PerTensor with dynamic scales takes those two one-pass forms too,
  // each tensor scale made first (launch_fp8_tensor_scale; the activation
  // kernel's CTA maxima); off, it quantizes in token order and gathers, and
  // quantizes the fp32 activation with the dynamic quantize kernels.
  bool fp8_tensor_scale_first = true;
  // How GEMM2 runs (plan_layer fills it; plan/gemm2_gate.h): the expert
  // path (y, then the finalize), the combine path, or both with the gate
  // choosing on the device.
  Gemm2Mode gemm2_mode = Gemm2Mode::Expert;
  // How routing and permute launch (plan_layer fills it).
  RoutingPlan routing;

  // What runs, one line: "path=cutlass sm90=coop_128x128x64" (FP8:
  // "path=cutlass sm90=fp8_pingpong_64x128x128", or G1:G2 where GEMM2's
  // tactic differs),
  // "path=mma tile_m=16 gemm1=m16n64 gemm2=m16n64" (the experts part; the
  // routing part prints itself), then " gemm2_path=gate" or
  // " gemm2_path=combine" where GEMM2 is not the expert path alone.
  std::string to_string() const;
};

// The rule: rows per local expert decide (crossover measured on the H200;
// see layer_plan.cpp for every constant and the figures behind it): the
// Stream path up to half a row per expert, and for small I up to one row;
// else up to 96 rows
// the Mma path (16-row tiles 64 columns wide up to 8 rows per expert);
// many rows: the Cutlass path's wgmma tiles. FP8 variants: the Stream path
// up to 2 rows per expert, the Cutlass path above (no Mma path). options.backend "mma",
// "cutlass" or "stream" forces the path (Mma then never streams). The rule
// was measured on the 132-SM H200 only.
//
// `tuned`, when given (the autotuner's winner for the call's token bucket),
// replaces the rule: its path, and on the Mma and Stream paths its GEMM
// tactics (tile_m = their tile_m); on the Cutlass path its sm90 tactic (the
// other fields keep the rule's values, which that path does not run). Throws
// Error (field "tuning_choice") when its path is one options.backend
// forbids or its GEMM tactics do not fit its path (check_choice_tactics).
LayerPlan plan_for_tokens(const MoEConfig& config, int num_tokens,
                          const TuningChoice* tuned = nullptr);

// The whole plan of a call: plan_for_tokens' experts part, with the
// development overrides applied to its launch details, the GEMM2 mode
// (gemm2_mode_for), and plan_routing's routing part (plan/routing_plan.h).
// What the layer runs and describes.
LayerPlan plan_layer(const MoEConfig& config, int num_tokens, bool precomputed,
                     const RoutingDeviceCaps& caps, const DevOverrides& dev,
                     const TuningChoice* tuned = nullptr);

// How a call of `num_tokens` tokens on experts path `path` runs GEMM2. The
// rule: the expert path. dev.gemm2_path replaces it where the combine path
// serves (combine_serves) and GEMM1 writes act in permuted row order (the
// Mma and Stream paths): "expert", "combine" (that path alone, no gate) or
// "gate" (both, chosen on the device).
Gemm2Mode gemm2_mode_for(const MoEConfig& config, int num_tokens, ExpertsPath path,
                         const DevOverrides& dev);

// Throws Error (field "tuning_choice") unless the choice's GEMM tactics fit
// its path: Stream takes the stream tactic for both GEMMs; Mma takes tiled
// tactics with one tile_m (they run over one tile schedule); Cutlass does
// not run them.
void check_choice_tactics(const TuningChoice& choice);

// Empty when the GPU layer can serve `config`, else the reason (the rule that
// failed). Checked by MoELayer::create.
std::string gpu_unsupported_reason(const MoEConfig& config);

// What the GPU layer asks of H and I for variant q (the format's own
// multiple, hidden_multiple / intermediate_multiple, may be smaller): 128
// for the FP8 variants, whose GEMMs scale per 128-wide K block; else 1.
int gpu_shape_multiple(QuantVariant q);

}  // namespace unimoe
