// The fuzzer's cases (unimoe-bench --fuzz): random valid layers and the
// calls made on each, every value a pure function of (seed, layer, call),
// so that one line (`--fuzz-case SEED:LAYER:CALL`) reproduces a case. Pure
// host code: the GPU fuzzer (tools/bench/fuzz.cpp) runs these cases against
// the CPU reference, and the planning slice below runs in every test run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dev/overrides.h"
#include "unimoe/unimoe.h"

namespace unimoe::bench {

// Calls made on each fuzzed layer (one layer, weights filled once).
inline constexpr int kFuzzCallsPerLayer = 8;

// The relative L2 error a fuzzed call's checked rows may show: twice the
// benchmark's bound (reference_tolerance). The fuzzer's shapes go down to
// I = 8 and one token, where a single large intermediate value can carry its
// bf16 roundings (GEMM1's output on the cutlass path, the intermediate, y
// and out) coherently into a whole output row; the presets' rows average
// over hundreds of values. The fuzzer reports its largest errors.
double fuzz_error_bound(QuantVariant quant);

// One layer: the config (every policy, E, K, groups, H and I at their legal
// multiples, every activation, biases, an expert-parallel range, fp32 or
// bf16 logits, a quant variant the GPU serves, a backend forced or auto, a
// routing variant forced or auto, the GEMM2 path) and its max_tokens.
struct FuzzLayer {
  uint64_t seed = 0;  // the weights' and the calls' seed
  MoEConfig config;
  int max_tokens = 1;
  // The layer's development override gemm2_path (docs/gemm2-gate.md): the
  // rule, the combine path or the gate, drawn for every layer (it changes
  // only BF16 calls of at most 1024 rows on the mma and stream paths).
  std::string gemm2_path = "auto";
  // Expert parallelism: 0 for the plain layer, else W ranks of an EPLayer
  // over the loopback transport (include/unimoe/ep.h), each with E / W of
  // the experts and max_tokens tokens a call. Drawn for about a quarter of
  // the configs with the default expert range and no FP8PerTensor (which EP
  // takes only with static scales), W from {2, 3, 4, 8} dividing E.
  int ep_world = 0;
  // FP8PerTensor only: the activations' static scales (the synthetic
  // weights' x_scale and act_scale, tools/bench/support/device_weights.h)
  // instead of dynamic ones, drawn for about half of those layers.
  bool static_scales = false;
  // The layer's per-call buffers (a rank's, for EP) in a scratch of the
  // fuzzer's (MoELayer::create / EPLayer::create with a scratch), filled
  // with 0xff bytes before every forward and replay, as another layer's
  // calls would leave it: no result may depend on what a call finds there.
  // Drawn for about a third of the layers.
  bool shared_scratch = false;
  // The decode chain's folds (development knobs fp8_quant_in_gemm=1 and
  // finalize_in_gemm2=16: FP8 stream GEMMs quantizing their own input at
  // one token, the FP8 and 4-bit stream GEMM2 folding the finalize), drawn
  // for about half of the layers; they change only those variants' stream
  // path calls.
  bool decode_folds = false;
};


// Router logits of a call.
enum class FuzzLogits {
  Uniform,      // unit-variance logits
  Skewed,       // a Zipf-like preference for low expert ids
  HotExpert,    // one expert far ahead in every token: it takes every token
  Adversarial,  // rows of NaN, +-inf, +-3e38 and equal values among normal rows
};
// Where the call's routing comes from.
enum class FuzzRouting {
  Logits,              // the layer routes
  Precomputed,         // valid ids and weights passed in
  PrecomputedHostile,  // ids outside [0, E), repeated ids, negative and NaN weights
};
const char* to_string(FuzzLogits v);
const char* to_string(FuzzRouting v);

// Ids the hostile precomputed routing draws besides valid ones.
enum class HostileId { MinusOne, NumExperts, PastEnd, IntMax, IntMin, Repeat };
inline constexpr int kHostileIdKinds = 6;

struct FuzzCall {
  uint64_t seed = 0;
  int num_tokens = 0;  // 0, 1, odd, max_tokens and anything between
  FuzzLogits logits = FuzzLogits::Uniform;
  FuzzRouting routing = FuzzRouting::Logits;
};

// Layer `layer` of the run with seed `seed`, and its call `call`
// (0 <= call < kFuzzCallsPerLayer). The config passes validate() and the
// GPU layer serves it (gpu_unsupported_reason is empty).
FuzzLayer fuzz_layer(uint64_t seed, int layer);
FuzzCall fuzz_call(const FuzzLayer& layer, int call);
// `dev` with the layer's gemm2_path, unless `dev` sets one (an
// UNIMOE_GEMM2_PATH in the environment then holds for every layer), and
// with its decode folds where drawn, unless `dev` sets either knob.
DevOverrides fuzz_dev_overrides(const FuzzLayer& layer, DevOverrides dev);

// Tokens rank r of an EP layer passes to call `call`: the call's T for
// rank 0, any of 0..max_tokens for the others.
int fuzz_ep_tokens(const FuzzLayer& layer, const FuzzCall& call, int rank);

// One line: the config text, max_tokens and the call.
std::string describe(const FuzzLayer& layer, const FuzzCall& call);
// "SEED:LAYER:CALL" and back; parse throws Error (field "fuzz-case").
std::string case_id(uint64_t seed, int layer, int call);
void parse_case_id(const std::string& s, uint64_t& seed, int& layer, int& call);

// The call's logits [T, E] (fp32 values, before any bf16 rounding).
std::vector<float> fuzz_logits(const FuzzLayer& layer, const FuzzCall& call);

// The call's precomputed routing [T, K] (Precomputed and PrecomputedHostile).
// nan_token: the token given a NaN weight, or -1.
struct FuzzPrecomputed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  int nan_token = -1;
  int hostile_ids[kHostileIdKinds] = {};  // how many of each kind were drawn
};
FuzzPrecomputed fuzz_precomputed(const FuzzLayer& layer, const FuzzCall& call);

// The tokens whose output is compared with the CPU reference: the first,
// the last and one more (an adversarial row where the call has them),
// increasing and distinct; empty for T = 0.
std::vector<int> fuzz_check_tokens(const FuzzLayer& layer, const FuzzCall& call);

// Whether row `token` of the call's logits was made adversarial.
bool is_adversarial_row(const FuzzLayer& layer, const FuzzCall& call, int token);

// The planning slice: for layers [first_layer, first_layer + layers) of
// `seed` and all their calls, the config validates, the GPU layer serves it
// and its forced backend, plan_layer plans every call on two device kinds,
// and the CPU reference takes every call's routing (logits: K distinct ids
// in range and finite weights for each checked token; precomputed: every
// id, out-of-range ones counted nowhere).
struct FuzzPlanFailure {
  std::string id;    // case_id
  std::string what;  // the check that failed, and the config
};
struct FuzzPlanSummary {
  int cases = 0;
  std::vector<FuzzPlanFailure> failures;
};
FuzzPlanSummary run_fuzz_planning(uint64_t seed, int first_layer, int layers);

}  // namespace unimoe::bench
