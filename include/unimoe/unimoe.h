// unimoe: the Mixture-of-Experts layer of LLM inference on NVIDIA Hopper.
//
// This is the one public header. It holds, in order:
//   1. the enums and the config (routing, experts, quantization, backend);
//   2. the error type, and validate();
//   3. the weights and per-call activations, as raw device pointers;
//   4. the layer.
// Names follow the glossary of the design: T tokens, H hidden size,
// I intermediate size per expert, E experts, K top_k.
//
// The header needs no CUDA header: streams are passed as CUstream_st*, which
// is what cudaStream_t is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

struct CUstream_st;

namespace unimoe {

inline constexpr const char* kVersion = "0.1.0";

// ---------------------------------------------------------------- enums ----

// How router logits become (expert ids, weights). Formulas: docs/routing.md.
enum class RoutingPolicy {
  Default,           // ids topk(softmax(x)), weights softmax(x)[ids]
  Renormalize,       // ids topk(x), weights softmax(x[ids])
  RenormalizeNaive,  // ids topk(softmax(x)), weights renormalized to sum 1
  TopK,              // ids topk(x), weights x[ids]
  Sigmoid,           // ids topk(sigmoid(x)), weights sigmoid(x)[ids]
  SigmoidRenorm,     // as Sigmoid, weights renormalized to sum 1
  TopKSigmoid,       // ids topk(x), weights sigmoid(x[ids])
  Llama4,            // K = 1: id argmax(x), weight sigmoid(x[id])
  DeepSeekV3,        // grouped, biased sigmoid scores, scaled renormalized weights
  MiniMax2,          // DeepSeekV3 with one group
};

enum class Activation {
  SwiGLU,     // silu(g) * u
  GeGLU,      // gelu(g) * u (erf form)
  ReLU2,      // relu(x)^2, not gated: GEMM1 has N = I
  SwiGLUOai,  // gpt-oss: clamped, alpha-scaled SwiGLU with (u + 1)
};

enum class QuantVariant {
  BF16,          // bf16 weights and activations
  FP8PerTensor,  // e4m3 weights, one fp32 scale per expert and matrix; e4m3 activations
  FP8Block128,   // e4m3 weights, fp32 scale per 128x128 block; activations per token x 128
  MXFP4,         // e2m1 weights, e8m0 scale per 32 along K; bf16 activations
  NVFP4,         // e2m1 weights, e4m3 scale per 16 along K + fp32 per matrix; bf16 activations
};

enum class LogitsType { F32, BF16 };

// Each enum prints and parses; parse throws Error naming the allowed values.
std::string to_string(RoutingPolicy v);
std::string to_string(Activation v);
std::string to_string(QuantVariant v);
std::string to_string(LogitsType v);
RoutingPolicy parse_routing_policy(const std::string& s);
Activation parse_activation(const std::string& s);
QuantVariant parse_quant_variant(const std::string& s);
LogitsType parse_logits_type(const std::string& s);

// --------------------------------------------------------------- config ----

struct RoutingConfig {
  RoutingPolicy policy = RoutingPolicy::Renormalize;
  int num_experts = 0;                 // E
  int top_k = 0;                       // K
  int n_group = 1;                     // DeepSeekV3: expert groups (E % n_group == 0)
  int topk_group = 1;                  // DeepSeekV3: groups kept per token
  float routed_scaling_factor = 1.0f;  // DeepSeekV3 / MiniMax2 weight scale
  bool has_bias = false;               // DeepSeekV3 / MiniMax2: score-correction bias [E]
  LogitsType logits_type = LogitsType::F32;
};

struct ExpertsConfig {
  int hidden = 0;        // H
  int intermediate = 0;  // I, per expert
  Activation activation = Activation::SwiGLU;
  float swiglu_alpha = 1.702f;  // SwiGLUOai only
  float swiglu_limit = 7.0f;    // SwiGLUOai only
  bool has_bias = false;        // per-expert biases on both GEMMs (gpt-oss)
  int local_expert_offset = 0;  // expert-parallel range served by this rank:
  int num_local_experts = -1;   // [offset, offset + count); -1 means all E
  QuantVariant quant = QuantVariant::BF16;
};

struct BackendOptions {
  std::string backend = "auto";  // "auto" (autotuned / heuristic) or a backend name
  bool deterministic = true;     // fixed-order finalize; no atomics on the output
  // How routing and permute run: "auto" (the measured rule per call size),
  // "split", "fused" or "cluster" (forced where that kernel serves the call:
  // T * K <= 4096 and E_local <= 1024; split elsewhere). docs/routing.md.
  std::string routing_variant = "auto";
};

struct MoEConfig {
  RoutingConfig routing;
  ExpertsConfig experts;
  BackendOptions options;

  // E_local: num_local_experts, or E when it is -1.
  int local_experts() const;
  // Rows of GEMM1's output per token: 2I for gated activations, I for ReLU2.
  int gemm1_cols() const;

  // One line, `key=value` pairs; parse(to_string()) gives the same config.
  // This string is the log line and the tuning-cache key.
  std::string to_string() const;
  static MoEConfig parse(const std::string& s);
};

// ---------------------------------------------------------------- errors ----

// Every refusal names the bad field and what is allowed.
class Error : public std::invalid_argument {
 public:
  Error(std::string field, const std::string& message);
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// Throws Error on the first impossible setting; does nothing otherwise.
void validate(const MoEConfig& config);

// Alignment each quant variant needs of H and I (multiple of).
int hidden_multiple(QuantVariant q);
int intermediate_multiple(QuantVariant q);

// -------------------------------------------------- weights and activations ----
// All pointers are device pointers. Shapes are for the E_local experts of this
// rank: w13 [E_local, gemm1_cols, H] with the gate rows first then the up rows
// (for BF16 and FP8, interleaved checkpoints are reordered by the caller;
// MXFP4 and NVFP4 take them as they are, w13_interleaved below); w2
// [E_local, H, I]. Elements are bf16 for BF16, e4m3 ("fn", one byte) for
// the FP8 variants and packed e2m1 for MXFP4 and NVFP4 (below). Biases (has_bias) are fp32: b13 [E_local, gemm1_cols],
// b2 [E_local, H]. A NaN or inf in one expert's weights reaches only the
// tokens routed to that expert (docs/design.md, "Inputs outside the usual range").
//
// FP8 weight scales, fp32, dequantized weight = e4m3 value * scale
// (docs/quantization.md):
//   FP8Block128: one scale per 128 x 128 block, row-major, the layout of
//     DeepSeek-style checkpoints' weight_scale_inv:
//     w13_scale [E_local, gemm1_cols / 128, H / 128],
//     w2_scale  [E_local, H / 128, I / 128];
//   FP8PerTensor: one scale per expert and matrix: w13_scale [E_local],
//     w2_scale [E_local] (a checkpoint with separate gate and up scales
//     requantizes to one, as vLLM does).
// FP8PerTensor activations are quantized with one scale per GEMM input:
// computed on the device per call (amax / 448, no host sync) when the
// pointer is null, or the calibrated static scale a checkpoint ships
// (input_scale; one device float, values beyond 448 * scale saturate).
//
// MXFP4 and NVFP4 (W4A16, docs/quantization.md): w13 and w2 hold e2m1 codes
// packed two a byte along K, the even K index in the low nibble, as the
// checkpoints store them: w13 [E_local, gemm1_cols, H / 2] and w2
// [E_local, H, I / 2] bytes. One scale byte per block of K values, row-major:
//   MXFP4: e8m0 per 32: w13_block_scale [E_local, gemm1_cols, H / 32],
//     w2_block_scale [E_local, H, I / 32] (gpt-oss's *_scales tensors);
//   NVFP4: e4m3 per 16: w13_block_scale [E_local, gemm1_cols, H / 16],
//     w2_block_scale [E_local, H, I / 16], and the fp32 scale of each
//     expert's matrix in w13_scale [E_local] and w2_scale [E_local]
//     (weight = e2m1 * block scale * matrix scale).
// w13_interleaved: the w13 rows (and their block scales and b13) alternate
// gate, up, gate, up, ... as gpt-oss checkpoints store them; set_weights
// reorders them into the prepared copy (MXFP4 and NVFP4 only). The 4-bit
// variants make that copy of w13, w2 and their block scales (and of b13
// when interleaved) on the device in set_weights, the checkpoint's size
// again; the caller's arrays must still outlive the layer, as for every
// variant (autotune's reference check reads them).
// w13, w2, b13 and b2 must be 16-byte aligned, the fp32 scales 4-byte
// aligned (the block scales, bytes, need nothing); set_weights throws Error
// naming the field that is missing, misaligned, misplaced or not allowed
// for the config's variant.
struct ExpertWeights {
  const void* w13 = nullptr;
  const void* w2 = nullptr;
  const float* b13 = nullptr;
  const float* b2 = nullptr;
  const float* w13_scale = nullptr;  // FP8 variants and NVFP4
  const float* w2_scale = nullptr;   // FP8 variants and NVFP4
  const float* x_scale = nullptr;    // FP8PerTensor only: static scale of GEMM1's input x
  const float* act_scale = nullptr;  // FP8PerTensor only: static scale of GEMM2's input
                                     // (each one device float, positive and finite: set_weights
                                     // reads them back and refuses others)
  const uint8_t* w13_block_scale = nullptr;  // MXFP4 and NVFP4 only
  const uint8_t* w2_block_scale = nullptr;   // MXFP4 and NVFP4 only
  bool w13_interleaved = false;              // MXFP4 and NVFP4 only
};

// One call's inputs and output, all device memory. Any values are safe: no
// input makes the layer read out of bounds or touch another token's output
// (docs/design.md, "Inputs outside the usual range").
struct ForwardArgs {
  int num_tokens = 0;                 // T, at most the layer's max_tokens
  const void* x = nullptr;            // [T, H] bf16; a NaN spoils only its token's output
  const void* logits = nullptr;       // [T, E] fp32 or bf16 (RoutingConfig::logits_type); NaN counts as -inf
  const float* routing_bias = nullptr;  // [E] fp32, when RoutingConfig::has_bias
  // Precomputed routing: when both are set, logits are ignored. An id
  // outside [0, E) contributes nothing (like another rank's expert); a
  // repeated id adds its expert once per entry; weights are used as given,
  // so a NaN or inf weight makes that token's output non-finite.
  const int32_t* topk_ids = nullptr;        // [T, K]
  const float* topk_weights = nullptr;      // [T, K]
  void* out = nullptr;                // [T, H] bf16
};

// ------------------------------------------------------------- autotune ----
// What MoELayer::autotune tunes and how (docs/tuning.md, "Tuning from the
// library"). autotune throws Error naming the field ("autotune.tokens",
// "autotune.routing", "autotune.iters", "autotune.check_tokens") for a bad value.
struct AutotuneOptions {
  // Token counts whose buckets are tuned, each 1..max_tokens; a bucket's
  // candidates are timed at the largest count listed for it. Empty: every
  // bucket up to max_tokens, each timed at min(bucket, max_tokens).
  std::vector<int> tokens;
  // Routing distribution of the synthetic logits: "uniform", "skewed",
  // "zipf:S" or "hot:P" (docs/benchmarking.md, "Routing distributions").
  std::string routing = "uniform";
  int iters = 20;        // timed graph replays per candidate (>= 1)
  int check_tokens = 2;  // tokens compared with the CPU reference (>= 1)
  // Optional JSON tuning cache: winners for this device and config found
  // there are used without timing; new winners are saved to it (not when
  // options.backend forces a path: a restricted winner must not stand in
  // for the auto one).
  std::string cache_path;
  // One line per event (a cached winner, a rejected or timed candidate, a
  // winner); nullptr prints each line to stderr.
  std::function<void(const std::string&)> progress;
};

// ----------------------------------------------------------------- layer ----
// forward() never synchronizes with the host and allocates nothing, so it can
// be captured once in a CUDA graph and replayed for any routing outcome.
//
// Threads and streams (docs/design.md, "Threads and streams"). The library
// keeps no mutable state outside its layers, so:
// - different layers may be created, used and destroyed from different
//   threads at once, and may forward at the same time on different streams;
// - a layer has one workspace, which every forward (and every replay of a
//   graph captured from it) writes: its forwards must run one after another,
//   on one stream or on streams the caller orders, and its methods must not
//   be called from several threads at once; layers made with one shared
//   scratch (create with a scratch) count as one layer here;
// - set_weights, autotune and use_tuning_cache must not overlap a forward of
//   the layer in flight; destroy the layer, and free the weights and inputs
//   it reads, only once its forwards have completed;
// - a layer lives on the device current at create(): call it with that
//   device current, on that device's streams;
// - create(), the destructor, autotune and use_tuning_cache may allocate or
//   free device memory, which CUDA refuses while any thread captures a graph
//   in cudaStreamCaptureModeGlobal: capture in cudaStreamCaptureModeThreadLocal
//   where other threads make or destroy layers meanwhile.
class MoELayer {
 public:
  virtual ~MoELayer() = default;

  // Validates the config, plans and allocates the workspace for max_tokens.
  // Throws Error for an invalid config, std::runtime_error when this build or
  // device cannot serve it (the message says why).
  static std::unique_ptr<MoELayer> create(const MoEConfig& config, int max_tokens);

  // Shared scratch, for the MoE layers of one model. A layer's per-call
  // buffers (routing result, permutation, the intermediate and GEMM2's
  // output rows, the backends' buffers) hold nothing from one forward to
  // the next, so layers that forward one after another can share them:
  // size one device buffer for the largest of their scratch_bytes, and make
  // each layer with it. The layers then hold only what persists (FP8
  // per-tensor weight scales in block layout, 4-bit weights in the kernels'
  // layout, and for FP8 and 4-bit layers one int per 8 columns of H that
  // a GEMM2 folding the finalize counts with); workspace_bytes() does not
  // count the scratch.
  //
  // scratch_bytes: the bytes create() below needs for this config and
  // max_tokens on the current device (the buffers of the layer and of the
  // largest backend it may use; a tuned choice may take any the config's
  // backend option allows). Throws as create() does for a bad config.
  static std::size_t scratch_bytes(const MoEConfig& config, int max_tokens);
  // As create(config, max_tokens), with the per-call buffers in `scratch`:
  // device memory of the current device, 256-byte aligned (cudaMalloc's
  // is), at least scratch_bytes(config, max_tokens) bytes (Error naming
  // `scratch` otherwise). The layer does not own it: keep it until the layer
  // is destroyed. create() zeroes it (and waits for the device), so make
  // layers before any forward that uses the scratch is in flight. Layers
  // sharing a scratch must run their forwards (graph replays, autotune)
  // one after another, on one stream or streams the caller orders; a
  // forward overwrites what the previous one left there (the buffers'
  // contents are not outputs).
  static std::unique_ptr<MoELayer> create(const MoEConfig& config, int max_tokens, void* scratch,
                                          std::size_t scratch_size);

  virtual const MoEConfig& config() const = 0;
  virtual int max_tokens() const = 0;
  // options.backend: "auto" (the rule or tuned winners choose per call) or
  // the backend forced for every call.
  virtual std::string backend_name() const = 0;
  // What serves a call of num_tokens tokens, one line: backend, tiles and
  // tactics, then the routing plan (variant, kernel, launch shape,
  // selection), e.g. "path=stream tile_m=16 gemm1=stream_m16
  // gemm2=stream_m16 routing=cluster kernel=block ctas=1 threads=256 ...".
  virtual std::string describe(int num_tokens) const = 0;
  // Device memory the layer holds besides the weights (its workspace; the
  // CUTLASS backend's buffers once a call may take it), not counting a
  // scratch given to create().
  virtual std::size_t workspace_bytes() const = 0;
  // Keeps the pointers (not a copy); the weights must outlive the layer.
  // Checks them against the config's quant variant (Error naming the
  // field). FP8PerTensor also expands its per-expert scales into a buffer
  // the layer owns: a kernel and device synchronizations, so do not call it
  // while any thread captures a graph in cudaStreamCaptureModeGlobal.
  virtual void set_weights(const ExpertWeights& weights) = 0;
  virtual void forward(const ForwardArgs& args, CUstream_st* stream) = 0;

  // Uses the winners that `unimoe-bench --autotune --tuning-cache PATH`
  // saved for this GPU, CUDA and unimoe version and config (docs/tuning.md)
  // for the token buckets they cover; other buckets follow the built-in
  // rule. Returns what was used and why anything was not. A missing file
  // uses nothing; an unreadable one throws Error. Call before capturing.
  virtual std::string use_tuning_cache(const std::string& path) = 0;

  // Finds the fastest experts path and tactics for the token buckets of
  // `options` on this device: each candidate is checked against the CPU
  // reference on the layer's own weights (a failing one is reported and
  // excluded), then timed by CUDA-graph replay on synthetic inputs; the
  // fastest serves the bucket from then on, so a graph captured afterwards
  // uses it. Returns one line per bucket: "bucket 64 (T=33): tuned: <choice>"
  // or "... cached: <choice>". Needs set_weights first (else Error, field
  // "weights"). Allocates and synchronizes: never call during capture.
  // Throws std::runtime_error when no candidate of a bucket passes.
  virtual std::string autotune(const AutotuneOptions& options) = 0;
};

}  // namespace unimoe
