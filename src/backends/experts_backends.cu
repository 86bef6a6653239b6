// The three BF16 experts backends (the FP8 ones: fp8_backends.cu) (plan/layer_plan.h describes each path):
//   TileScheduleBackend serves the Mma and Stream paths: both run
//     launch_gemm1 / launch_gemm2 over the permute's tile schedule, with x
//     gathered on load, bias and activation in GEMM1's epilogue and b2 in
//     GEMM2's; the plan's GEMM tactics pick the mma.sync tiled kernels or
//     the swap-AB stream kernel;
//   CutlassBackend runs CUTLASS's Hopper grouped GEMM over contiguous
//     permuted rows: scatter (or gather) kernel, GEMM1, activation kernel, GEMM2; the
//     finalize adds b2. It owns the gathered rows, GEMM1's output and the
//     grouped GEMM's workspace.
// Weights: every backend so far reads the caller's layout as is
// (ExpertWeights in unimoe.h), so prepare_weights keeps the pointers and
// copies nothing.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>

#include "kernels/common/common.cuh"
#include "kernels/permute/expert_rows.cuh"
#include "kernels/gemm/grouped_gemm.cuh"
#include "kernels/gemm/sm90_grouped_gemm.cuh"
#include "backends/experts_backend.h"
#include "layer/workspace_carver.h"

namespace unimoe {
namespace {

class TileScheduleBackend final : public ExpertsBackend {
 public:
  TileScheduleBackend(ExpertsPath path, const MoEConfig& config)
      : ExpertsBackend(path), config_(config) {}

  void prepare_weights(const ExpertWeights& weights) override { weights_ = weights; }
  std::size_t scratch_bytes() const override { return 0; }
  std::size_t workspace_bytes() const override { return 0; }
  void allocate_workspace(char*) override {}

  void run_gemm1(const ExpertsCall& call, const LayerPlan& plan, cudaStream_t stream) override {
    Gemm1Params p;
    p.x = call.x;
    p.permuted_to_expanded = call.permuted_to_expanded;
    p.top_k = config_.routing.top_k;
    p.w13 = static_cast<const uint16_t*>(weights_.w13);
    p.b13 = weights_.b13;
    p.tiles = call.tiles;
    p.num_tiles = call.num_tiles;
    p.max_tiles = call.max_tiles;
    p.hidden = config_.experts.hidden;
    p.intermediate = config_.experts.intermediate;
    p.activation = config_.experts.activation;
    p.swiglu_alpha = config_.experts.swiglu_alpha;
    p.swiglu_limit = config_.experts.swiglu_limit;
    p.act_out = call.act;
    // GEMM2 follows at once; where the plan says so (the stream path at
    // moderate I), its first weight loads overlap this kernel's tail.
    p.trigger_dependents_early = plan.overlap_stream_gemms;
    p.stream_max_splits = plan.stream_max_splits;
    p.stream_one_token = plan.stream_one_token;
    launch_gemm1(p, plan.gemm1, KernelStream(stream, plan.pdl));
  }

  void run_gemm2(const ExpertsCall& call, const LayerPlan& plan, cudaStream_t stream) override {
    Gemm2Params p;
    p.act = call.act;
    p.w2 = static_cast<const uint16_t*>(weights_.w2);
    p.b2 = weights_.b2;
    p.tiles = call.tiles;
    p.num_tiles = call.num_tiles;
    p.max_tiles = call.max_tiles;
    p.hidden = config_.experts.hidden;
    p.intermediate = config_.experts.intermediate;
    p.y = call.y;
    // The schedule came from routing, which GEMM1 waited for before any
    // dependent could launch.
    p.schedule_ready_before_wait = plan.read_before_wait;
    // The finalize (a few CTAs at decode) launches during this kernel's
    // tail and reads the routing outputs before its wait.
    p.trigger_dependents_early = plan.gemm2.stream && plan.read_before_wait;
    p.stream_max_splits = plan.stream_max_splits;
    p.stream_one_token = plan.stream_one_token;
    launch_gemm2(p, plan.gemm2, KernelStream(stream, plan.pdl));
  }

  // GEMM2's epilogue adds b2.
  const float* finalize_b2() const override { return nullptr; }

 private:
  MoEConfig config_;
  ExpertWeights weights_{};
};

class CutlassBackend final : public ExpertsBackend {
 public:
  CutlassBackend(const MoEConfig& config, int max_tokens, int sm_count)
      : ExpertsBackend(ExpertsPath::Cutlass),
        config_(config),
        max_tokens_(max_tokens),
        sm_count_(sm_count) {
    WorkspaceCarver dry(nullptr);
    carve(dry);
    bytes_ = dry.used();
  }
  ~CutlassBackend() override {
    if (arena_) cudaFree(arena_);
  }

  void prepare_weights(const ExpertWeights& weights) override { weights_ = weights; }
  std::size_t scratch_bytes() const override { return bytes_; }
  std::size_t workspace_bytes() const override { return arena_ ? bytes_ : 0; }
  void allocate_workspace(char* scratch) override {
    if (placed_) return;
    if (!scratch) {
      UNIMOE_CUDA_CHECK(cudaMalloc(&arena_, bytes_));
      // Once: the GEMM's descriptors are read whole (sm90_grouped_gemm.cuh),
      // and initcheck does not see its TMA stores (moe_layer.cu). A
      // caller's scratch the layer zeroes at creation.
      UNIMOE_CUDA_CHECK(cudaMemset(arena_, 0, bytes_));
      scratch = static_cast<char*>(arena_);
    }
    WorkspaceCarver real(scratch);
    carve(real);
    placed_ = true;
  }

  void run_gemm1(const ExpertsCall& call, const LayerPlan& plan, cudaStream_t stream) override {
    require_workspace();
    const int capacity = call.num_tokens * config_.routing.top_k;
    if (plan.row_scatter) {
      ScatterRowsParams s;
      s.x = call.x;
      s.expanded_to_permuted = call.expanded_to_permuted;
      s.num_tokens = call.num_tokens;
      s.top_k = config_.routing.top_k;
      s.hidden = config_.experts.hidden;
      s.out = gathered_;
      launch_scatter_rows(s, KernelStream(stream, plan.pdl));
    } else {
      GatherRowsParams g;
      g.x = call.x;
      g.permuted_to_expanded = call.permuted_to_expanded;
      g.expert_offsets = call.expert_offsets;
      g.num_groups = config_.local_experts();
      g.top_k = config_.routing.top_k;
      g.hidden = config_.experts.hidden;
      g.capacity = capacity;
      g.out = gathered_;
      launch_gather_rows(g, KernelStream(stream, plan.pdl));
    }
    run_sm90_gemm(call, gathered_, weights_.w13, h_, config_.gemm1_cols(), config_.experts.hidden,
                  plan, stream);
    GatedActivationParams act;
    act.h = h_;
    act.b13 = weights_.b13;
    act.expert_offsets = call.expert_offsets;
    act.num_groups = config_.local_experts();
    act.capacity = capacity;
    act.intermediate = config_.experts.intermediate;
    act.activation = config_.experts.activation;
    act.swiglu_alpha = config_.experts.swiglu_alpha;
    act.swiglu_limit = config_.experts.swiglu_limit;
    act.out = call.act;
    launch_gated_activation(act, KernelStream(stream, plan.pdl));
  }

  void run_gemm2(const ExpertsCall& call, const LayerPlan& plan, cudaStream_t stream) override {
    require_workspace();
    run_sm90_gemm(call, call.act, weights_.w2, call.y, config_.experts.hidden,
                  config_.experts.intermediate, plan, stream);
  }

  // The grouped GEMM has no bias epilogue: the finalize adds b2 (or nothing).
  const float* finalize_b2() const override { return weights_.b2; }

 private:
  void carve(WorkspaceCarver& c) {
    const std::size_t rows = static_cast<std::size_t>(max_tokens_) * config_.routing.top_k;
    gathered_ = c.take<uint16_t>(rows * config_.experts.hidden);
    h_ = c.take<uint16_t>(rows * config_.gemm1_cols());
    sm90_workspace_ =
        c.take<char>(sm90_grouped_gemm_workspace_bytes(config_.local_experts(), sm_count_));
  }

  void require_workspace() const {
    if (!placed_)
      throw std::runtime_error("the Cutlass path's buffers were not allocated for this layer");
  }

  void run_sm90_gemm(const ExpertsCall& call, const uint16_t* a, const void* b, uint16_t* d,
                     int n, int k, const LayerPlan& plan, cudaStream_t stream) const {
    Sm90GroupedGemmParams p;
    p.a = a;
    p.expert_offsets = call.expert_offsets;
    p.b = static_cast<const uint16_t*>(b);
    p.d = d;
    p.num_groups = config_.local_experts();
    p.n = n;
    p.k = k;
    p.workspace = sm90_workspace_;
    p.sm_count = sm_count_;
    p.tactic = plan.sm90;
    launch_sm90_grouped_gemm(p, KernelStream(stream, plan.pdl));
  }

  MoEConfig config_;
  int max_tokens_;
  int sm_count_;
  ExpertWeights weights_{};
  std::size_t bytes_ = 0;
  void* arena_ = nullptr;  // the scratch allocation when the layer gave none
  bool placed_ = false;    // the pointers below are set
  uint16_t* gathered_ = nullptr;  // [T*K, H] x rows in permuted order
  uint16_t* h_ = nullptr;         // [T*K, gemm1_cols] GEMM1 output before the activation
  void* sm90_workspace_ = nullptr;
};

}  // namespace

std::unique_ptr<ExpertsBackend> make_experts_backend(ExpertsPath p, const MoEConfig& config,
                                                     int max_tokens, int sm_count) {
  const QuantVariant q = config.experts.quant;
  if (q == QuantVariant::FP8Block128 || q == QuantVariant::FP8PerTensor)
    if (std::unique_ptr<ExpertsBackend> fp8 = make_fp8_experts_backend(p, config, max_tokens, sm_count))
      return fp8;
  if (q == QuantVariant::MXFP4 || q == QuantVariant::NVFP4)
    if (std::unique_ptr<ExpertsBackend> w4 = make_w4_experts_backend(p, config)) return w4;
  switch (p) {
    case ExpertsPath::Mma:
    case ExpertsPath::Stream: return std::make_unique<TileScheduleBackend>(p, config);
    case ExpertsPath::Cutlass:
      return std::make_unique<CutlassBackend>(config, max_tokens, sm_count);
  }
  throw std::logic_error("make_experts_backend: unknown experts path");
}

}  // namespace unimoe
