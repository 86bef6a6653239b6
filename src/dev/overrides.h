// Development overrides: the switches that replace a measured rule with a
// fixed choice, for A/B timing, sweeps and tests. They are read from the
// environment once, by one parser (from_environment), and every value is
// validated: a bad one is refused with the variable's name and what is
// allowed. unimoe-bench sets the same fields from `--dev name=value`, tests
// set them directly. The layer keeps its copy and passes it to the plans;
// kernels and launchers never read the environment.
//
// Each field's default is "follow the measured rule". The variables and what
// each one does: docs/benchmarking.md, "Development knobs".
#pragma once

#include <string>
#include <vector>

namespace unimoe {

// The DeepSeek decode kernels' wide choice: by the measured rule, never, or
// wherever it serves.
enum class WideChoice { kMeasured, kOff, kEverywhere };

// GEMM2's path where the combine path serves (plan/gemm2_gate.h): the
// rule's, the expert path alone, the combine path alone, or the gate.
enum class DevGemm2Path { kRule, kExpert, kCombine, kGate };

struct DevOverrides {
  // ---- routing: the fused, cluster and spread kernels
  bool sorted_pair = true;       // UNIMOE_SORTED_PAIR: 33..64 rows by one warp's sort
  bool direct_keys = true;       // UNIMOE_DIRECT_KEYS: DeepSeek keys a warp a token
  bool cluster_spread = true;    // UNIMOE_CLUSTER_SPREAD: the spread kernel may serve
  int spread_from_tokens = 0;    // UNIMOE_SPREAD_FROM_TOKENS: 0 = measured rule
  int spread_max_ctas = 0;       // UNIMOE_SPREAD_MAX_CTAS: 0 = device's largest, else 2..16
  int spread_min_tokens = 0;     // UNIMOE_SPREAD_MIN_TOKENS: 0 = measured rule
  int cluster_min_tokens = 0;    // UNIMOE_CLUSTER_MIN_TOKENS: 0 = measured rule
  int cluster_max_ctas = 0;      // UNIMOE_CLUSTER_MAX_CTAS: 0 = measured rule, else 2..16
  bool fixed_choice = true;      // UNIMOE_FIXED_CHOICE: DeepSeek-V3's shape compiled in
  bool ranked_threshold = true;  // UNIMOE_RANKED_THRESHOLD
  WideChoice wide_choice = WideChoice::kMeasured;  // UNIMOE_WIDE_CHOICE: 0 off, 1 everywhere
  // ---- routing: the split chain
  int split_batch_min_tokens = 0;         // UNIMOE_SPLIT_BATCH_MIN_TOKENS: 0 = measured rule
  int split_sort_from_topk = 0;           // UNIMOE_SPLIT_SORT_FROM_TOPK: 0 = measured rule
  int split_octets_min_tokens = 0;        // UNIMOE_SPLIT_OCTETS_MIN_TOKENS: 0 = measured rule
  int split_octet_filter_min_tokens = 0;  // UNIMOE_SPLIT_OCTET_FILTER_MIN_TOKENS: 0 = rule
  bool split_octet_count = true;          // UNIMOE_SPLIT_OCTET_COUNT
  bool split_kept_halves = true;          // UNIMOE_SPLIT_KEPT_HALVES
  bool permute_trigger = true;            // UNIMOE_PERMUTE_TRIGGER
  bool scatter_masks = true;              // UNIMOE_SCATTER_MASKS
  // ---- the whole chain and the experts GEMMs
  bool pdl = true;               // UNIMOE_PDL: programmatic dependent launch
  bool stream_one_token = true;  // UNIMOE_STREAM_ONE_TOKEN
  int stream_max_splits = 0;     // UNIMOE_STREAM_MAX_SPLITS: 0 = measured rule, else 1, 2, 4, 8
  bool stream_overlap = true;    // UNIMOE_STREAM_OVERLAP
  bool next_prefetch = true;     // UNIMOE_NEXT_PREFETCH: FP8 decode GEMM1 fetches GEMM2's weights into L2
  bool fp8_wide_ctas = true;     // UNIMOE_FP8_WIDE_CTAS: FP8 stream CTAs of two column blocks
  bool fp8_quant_early = true;   // UNIMOE_FP8_QUANT_EARLY: FP8 stream GEMMs launch during their quantize
  bool fp8_act_quant_fused = true;  // UNIMOE_FP8_ACT_QUANT_FUSED: FP8 cutlass activation + quantize
  bool fp8_quant_scatter = true;    // UNIMOE_FP8_QUANT_SCATTER: FP8 cutlass x into permuted rows
  bool row_scatter = true;          // UNIMOE_ROW_SCATTER: BF16 cutlass x rows scattered, not gathered
  // UNIMOE_FP8_TENSOR_SCALE_FIRST: FP8PerTensor's dynamic scale made before
  // the one-pass kernels on the cutlass path.
  bool fp8_tensor_scale_first = true;
  int w4_tile_m = 0;             // UNIMOE_W4_TILE_M: 0 = measured rule, 16, 64 or 128
  // UNIMOE_W4_PIPELINE: the 16-row 4-bit form refills its register load
  // ring step by step (not yet measured, so off by default).
  bool w4_pipeline = false;
  // UNIMOE_FP8_QUANT_IN_GEMM: the FP8 stream path at one token quantizes x
  // in GEMM1 and the activation in GEMM2, without the quantize kernels (not
  // yet run on a GPU, so off by default).
  bool fp8_quant_in_gemm = false;
  // UNIMOE_FINALIZE_IN_GEMM2: the FP8 and 4-bit stream GEMM2 fold the
  // finalize into the CTAs that complete each column block, for calls of at
  // most this many tokens (0: never, the default until it is measured).
  int finalize_in_gemm2 = 0;
  DevGemm2Path gemm2_path = DevGemm2Path::kRule;  // UNIMOE_GEMM2_PATH: auto, expert, combine, gate
  // UNIMOE_MMA_TACTIC: "" (the rule, written "auto"), or "G1" or "G1:G2", the
  // mma path's GEMM1 and GEMM2 tactics (tiled, one tile_m; GEMM2 = G1 when
  // G2 is not given), wherever the mma path runs.
  std::string mma_tactic;
  // UNIMOE_FP8_TACTIC: "" (the rule, written "auto"), or "G1" or "G1:G2",
  // the FP8 cutlass path's blockwise GEMM tactics for GEMM1 and GEMM2
  // (GEMM2 = G1 when G2 is not given), wherever that path runs.
  std::string fp8_tactic;
  // UNIMOE_TUNE_WGMMA: the autotuner also offers the wgmma kernels (the BF16
  // wgmma tactics, FP8's mma path), which it leaves out by default.
  bool tune_wgmma = false;

  // Every UNIMOE_* variable above that is set, validated; throws
  // std::invalid_argument naming the variable and the allowed values. An
  // unknown UNIMOE_* variable (a typo) is refused too, except the ones the
  // test and build scripts read (kForeignVariables in overrides.cpp).
  static DevOverrides from_environment();
  // The same for one `name=value` (name: the variable without UNIMOE_,
  // either case, e.g. "sorted_pair=0"); throws std::invalid_argument.
  void set(const std::string& name_value);
  // The fields that differ from the defaults, "name=value" separated by
  // spaces; "" when none. set() takes each back.
  std::string to_string() const;
  // The knob names, lower case, in declaration order.
  static std::vector<std::string> names();

  bool operator==(const DevOverrides& o) const { return to_string() == o.to_string(); }
  bool operator!=(const DevOverrides& o) const { return !(*this == o); }
};

}  // namespace unimoe
