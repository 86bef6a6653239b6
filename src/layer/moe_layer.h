// The layer behind the public MoELayer: the plan (src/plan/layer_plan.h, or
// a tuned choice per token bucket), the workspace sized once from (config,
// max_tokens), the experts backends (layer/experts_backend.h) and the fixed
// launch chain
//   routing -> permute -> gemm1 -> gemm2 -> finalize,
// where the plan's backend runs gemm1 and gemm2 and the layer the rest.
// Where the plan gates GEMM2 (plan/gemm2_gate.h) the chain is
//   routing -> permute, gate -> gemm1 -> combine, gemm2 -> finalize
// with every kernel launched on every call and the gate's record telling
// the unchosen path's kernels to return at once.
// Each stage can also be launched alone, so that the benchmark can time it.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "kernels/gemm/gemm2_combine.cuh"
#include "kernels/permute/permute.cuh"
#include "backends/experts_backend.h"
#include "dev/overrides.h"
#include "layer/workspace_carver.h"
#include "plan/layer_plan.h"
#include "plan/tuning.h"
#include "ref/ref.h"
#include "unimoe/unimoe.h"

namespace unimoe {

enum class Stage { Routing, Permute, Gemm1, Gemm2, Finalize };
inline constexpr std::array<Stage, 5> kStages = {Stage::Routing, Stage::Permute, Stage::Gemm1,
                                                 Stage::Gemm2, Stage::Finalize};
const char* stage_name(Stage s);

// The current CUDA device as the tuning cache keys it.
TuningDevice current_tuning_device();
// The current CUDA device as backend legality sees it.
DeviceArch current_device_arch();

// A caller's device buffer for a layer's per-call buffers (MoELayer::create
// with a scratch).
struct ScratchBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

// Throws Error (field "scratch") unless `scratch` is device memory of the
// current device, 256-byte aligned and at least `need` bytes, what the
// layer's config needs at `max_tokens`; `sizer` names the function that
// gives `need` (for the message).
void check_scratch(const ScratchBuffer& scratch, std::size_t need, int max_tokens,
                   const char* sizer);

class MoELayerImpl final : public MoELayer {
 public:
  // `dev`: the development overrides every plan of the layer applies
  // (MoELayer::create passes DevOverrides::from_environment()).
  // `scratch`: the caller's device buffer for the per-call buffers
  // (MoELayer::create with a scratch), or null for an allocation of the
  // layer's own.
  MoELayerImpl(const MoEConfig& config, int max_tokens, const DevOverrides& dev,
               const ScratchBuffer* scratch = nullptr);
  ~MoELayerImpl() override;
  // MoELayer::scratch_bytes: the layer's per-call buffers, then room for
  // the largest of its backends' (one backend runs at a time).
  static std::size_t scratch_bytes(const MoEConfig& config, int max_tokens);
  MoELayerImpl(const MoELayerImpl&) = delete;
  MoELayerImpl& operator=(const MoELayerImpl&) = delete;

  const MoEConfig& config() const override { return config_; }
  int max_tokens() const override { return max_tokens_; }
  std::string backend_name() const override { return config_.options.backend; }
  std::string describe(int num_tokens) const override;
  // The arena (unless in a caller's scratch) plus what every backend the
  // layer holds allocated itself.
  std::size_t workspace_bytes() const override;
  void set_weights(const ExpertWeights& weights) override;
  void forward(const ForwardArgs& args, CUstream_st* stream) override;
  std::string use_tuning_cache(const std::string& path) override;
  // In layer/autotune.cu.
  std::string autotune(const AutotuneOptions& options) override;

  // Serve the calls of token bucket `bucket` with `choice` instead of the
  // rule (the autotuner tries candidates this way). Makes the choice's
  // backend, with its buffers, if the layer does not hold it yet: not during
  // capture.
  void set_tuned(int bucket, const TuningChoice& choice);
  // The choice serving token bucket `bucket`, if tuned; forgetting it
  // returns the bucket to the rule.
  std::optional<TuningChoice> tuned_choice(int bucket) const;
  void clear_tuned(int bucket);
  // The weights set_weights kept (null pointers before it).
  const ExpertWeights& weights() const { return weights_; }

  // What serves a call of `num_tokens` (`precomputed`: with ids and weights
  // given): the experts plan (rule or tuned winner) with its routing plan.
  // describe() prints it.
  LayerPlan plan_for(int num_tokens, bool precomputed = false) const;
  const DevOverrides& dev_overrides() const { return dev_; }
  const RoutingDeviceCaps& routing_caps() const { return routing_caps_; }

  // One stage of forward alone (the inputs of earlier stages must be in the
  // workspace already).
  void run_stage(Stage stage, const ForwardArgs& args, cudaStream_t stream);
  // FP8PerTensor with dynamic scales: the scales the last forward of
  // num_tokens tokens computed (x's and the activation's), read back (a
  // synchronizing copy), for a reference check of some of the call's
  // tokens; {0, 0} (dynamic, as the reference takes it) for every other
  // config. Tests and tools only.
  ref::ActivationScales dynamic_activation_scales(int num_tokens, bool precomputed = false);
  // Device copies of the routing result of the last forward, for tests and
  // the benchmark's active-expert count.
  const int32_t* expert_counts() const { return expert_counts_; }
  // The GEMM2 gate's record of the last gated forward (device memory), for
  // tests and the benchmark; its contents are unset before one.
  const Gemm2GateRecord* gemm2_gate_record() const { return gate_record_; }
  // Replaces the gate's cost model (gemm2_gate_model's) for the calls
  // launched or captured after it: tests use it to make a routing change
  // flip the choice at sizes the CPU reference can check.
  void set_gemm2_gate_model(const Gemm2GateModel& model) { gate_model_ = model; }
  // The GEMM2 output rows of the expert path (device, [max_tokens * K, H]
  // bf16), for tests that check the combine path leaves them alone.
  uint16_t* gemm2_rows() const { return y_; }

 private:
  void check_args(const ForwardArgs& args) const;
  // The scale pointers the config's quant variant needs, and no others.
  void check_quant_weights(const ExpertWeights& weights) const;
  // Allocates the backend's buffers, prepares it with the kept weights (if
  // set) and holds it.
  void keep_backend(std::unique_ptr<ExpertsBackend> backend);
  // The held backend of path `p`, made (and kept) first if missing.
  void ensure_backend(ExpertsPath p);
  // The held backend of path `p`; throws std::runtime_error if the layer
  // does not hold it (forward never makes one: that would allocate).
  ExpertsBackend& backend_for(ExpertsPath p);
  const TuningChoice* tuned_for(int num_tokens) const;
  // What the combine kernel of a call takes (the combine path; the gated
  // chain's tail adds the finalize's flag and parameters).
  CombineGemm2Params combine_params(const ForwardArgs& a, const float* weights,
                                    const LayerPlan& plan);
  // What the finalize of a call takes (its kernel, or GEMM2's fold).
  FinalizeParams finalize_params(const ForwardArgs& a, const float* weights, const int32_t* ids,
                                 const LayerPlan& plan);
  std::size_t fold_counters_bytes() const;
  // Hands out the per-call buffers (a dry run over a null base sizes them).
  void carve_arena(WorkspaceCarver& c);
  // A layer object that only sizes its buffers (scratch_bytes): no device
  // work, no checks.
  struct SizingOnly {};
  MoELayerImpl(SizingOnly, const MoEConfig& config, int max_tokens)
      : config_(config), max_tokens_(max_tokens) {}
  bool precomputed(const ForwardArgs& args) const;

  MoEConfig config_;
  int max_tokens_;
  DevOverrides dev_;
  RoutingDeviceCaps routing_caps_;  // probed at creation
  ExpertWeights weights_{};
  // The per-call buffers below: in arena_, the layer's allocation, or at
  // the start of a caller's scratch (arena_ null); backend_scratch_ is the
  // rest of that scratch, which every backend's buffers share (null: each
  // backend allocates its own).
  void* arena_ = nullptr;
  std::size_t arena_bytes_ = 0;
  char* backend_scratch_ = nullptr;
  int32_t* topk_ids_ = nullptr;
  float* topk_weights_ = nullptr;
  int32_t* expert_counts_ = nullptr;
  int32_t* expert_offsets_ = nullptr;
  int32_t* permuted_to_expanded_ = nullptr;
  int32_t* expanded_to_permuted_ = nullptr;
  DeviceTile* tiles_ = nullptr;
  int32_t* num_tiles_ = nullptr;
  uint16_t* act_ = nullptr;
  uint16_t* y_ = nullptr;
  Gemm2GateRecord* gate_record_ = nullptr;
  // The folded finalize's counters (FinalizeFold): the layer's own
  // allocation, zero between calls; null for BF16, whose GEMM2 does not fold.
  int32_t* fold_counters_ = nullptr;
  Gemm2GateModel gate_model_;
  void* permute_scratch_ = nullptr;
  std::map<int, TuningChoice> tuned_;  // token bucket -> winner
  int sm_count_ = 0;
  // Indexed by the ExpertsPath value; null where the layer
  // holds no backend of that path.
  std::array<std::unique_ptr<ExpertsBackend>, std::size(kExpertsPaths)> backends_;
};

}  // namespace unimoe
