// The W4A16 experts backend (MXFP4 and NVFP4; the contract is
// ExpertsBackend's, backends/experts_backend.h):
//   W4StreamBackend (Stream path, every token count): GEMM1 is the W4A16
//     stream kernel with x rows gathered on load and bias and activation in
//     its epilogue, writing the layer's bf16 act; GEMM2 the same kernel
//     with b2 in its epilogue, writing bf16 y. Activations stay bf16, as
//     the reference's W4A16 rounding says (docs/quantization.md).
// prepare_weights copies the checkpoint's codes into the prepared nibble
// order (core/fp4_layout.h), with the block scales, reordering gpt-oss's
// interleaved gate/up rows (and b13) where ExpertWeights::w13_interleaved
// says so. The layer owns that copy; NVFP4's matrix scales and b2 are read
// in place.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "backends/experts_backend.h"
#include "kernels/common/common.cuh"
#include "kernels/gemm/stream_gemm_w4.cuh"
#include "kernels/quant/fp4_weights.cuh"
#include "layer/workspace_carver.h"

namespace unimoe {
namespace {

// One matrix's prepared copy: codes [E, rows, cols / 2] and block scales
// [E, rows, cols / block], in one allocation.
struct PreparedMatrix {
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;
};

class W4StreamBackend final : public ExpertsBackend {
 public:
  W4StreamBackend(const MoEConfig& config)
      : ExpertsBackend(ExpertsPath::Stream),
        config_(config),
        format_(config.experts.quant == QuantVariant::MXFP4 ? W4Format::MXFP4 : W4Format::NVFP4),
        e_local_(config.local_experts()),
        hidden_(config.experts.hidden),
        inter_(config.experts.intermediate),
        n1_(config.gemm1_cols()) {}

  ~W4StreamBackend() override {
    if (prepared_) cudaFree(prepared_);
  }

  // Host-side set-up: the device is synchronized before (the caller may
  // have written the weights on any stream) and after (the copy is
  // complete before any forward, on any stream, reads it).
  void prepare_weights(const ExpertWeights& w) override {
    weights_ = w;
    const int block = w4_block_values(format_);
    WorkspaceCarver dry(nullptr);
    carve(dry, block, w);
    if (!prepared_ || prepared_bytes_ < dry.used()) {
      if (prepared_) UNIMOE_CUDA_CHECK(cudaFree(prepared_));
      prepared_ = nullptr;
      UNIMOE_CUDA_CHECK(cudaMalloc(&prepared_, dry.used()));
      prepared_bytes_ = dry.used();
    }
    WorkspaceCarver real(static_cast<char*>(prepared_));
    carve(real, block, w);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    // The bytes between a row's last scale and the next row's are read by
    // the kernel's 4-byte scale copies (and ignored): zero them once.
    UNIMOE_CUDA_CHECK(cudaMemset(prepared_, 0, prepared_bytes_));
    Fp4PrepareParams p13;
    p13.experts = e_local_;
    p13.rows = n1_;
    p13.cols = hidden_;
    p13.block = block;
    p13.interleaved = w.w13_interleaved;
    p13.src_codes = static_cast<const uint8_t*>(w.w13);
    p13.src_scales = w.w13_block_scale;
    p13.src_bias = w.w13_interleaved ? w.b13 : nullptr;
    p13.dst_codes = w13_.codes;
    p13.dst_scales = w13_.scales;
    p13.dst_scale_stride = scale_stride(hidden_, block);
    p13.dst_bias = w.w13_interleaved ? b13_ : nullptr;
    launch_prepare_fp4_weights(p13, KernelStream(nullptr, false));
    Fp4PrepareParams p2;
    p2.experts = e_local_;
    p2.rows = hidden_;
    p2.cols = inter_;
    p2.block = block;
    p2.src_codes = static_cast<const uint8_t*>(w.w2);
    p2.src_scales = w.w2_block_scale;
    p2.dst_codes = w2_.codes;
    p2.dst_scales = w2_.scales;
    p2.dst_scale_stride = scale_stride(inter_, block);
    launch_prepare_fp4_weights(p2, KernelStream(nullptr, false));
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // The per-call buffers are the layer's (act, y): nothing of its own.
  std::size_t scratch_bytes() const override { return 0; }
  std::size_t workspace_bytes() const override { return 0; }
  void allocate_workspace(char*) override {}

  void run_gemm1(const ExpertsCall& call, const LayerPlan& plan, cudaStream_t stream) override {
    require_weights();
    W4StreamGemmParams p = common(call);
    p.a = call.x;
    p.gather = call.permuted_to_expanded;
    p.top_k = config_.routing.top_k;
    p.b = w13_.codes;
    p.b_scales = w13_.scales;
    p.scale_stride = scale_stride(hidden_, w4_block_values(format_));
    p.b_global = format_ == W4Format::NVFP4 ? weights_.w13_scale : nullptr;
    p.bias = weights_.w13_interleaved && weights_.b13 ? b13_ : weights_.b13;
    p.b_rows = n1_;
    p.k = hidden_;
    p.n_out = inter_;
    p.epilogue = gemm1_epilogue(config_.experts.activation);
    p.up_offset = is_gated(p.epilogue) ? inter_ : 0;
    p.alpha = config_.experts.swiglu_alpha;
    p.limit = config_.experts.swiglu_limit;
    p.out = call.act;
    // GEMM2 reads its schedule and weights before its wait: let it launch
    // once this kernel's loads are out, where the plan overlaps them.
    p.early_dependents = plan.overlap_stream_gemms;
    p.tile_m = plan.tile_m;
    p.pipelined = plan.w4_pipeline;
    launch_w4_stream_gemm(p, KernelStream(stream, plan.pdl));
  }

  void run_gemm2(const ExpertsCall& call, const LayerPlan& plan, cudaStream_t stream) override {
    require_weights();
    W4StreamGemmParams p = common(call);
    p.a = call.act;
    p.b = w2_.codes;
    p.b_scales = w2_.scales;
    p.scale_stride = scale_stride(inter_, w4_block_values(format_));
    p.b_global = format_ == W4Format::NVFP4 ? weights_.w2_scale : nullptr;
    p.bias = weights_.b2;
    p.b_rows = hidden_;
    p.k = inter_;
    p.n_out = hidden_;
    p.epilogue = GemmEpilogue::Identity;
    p.out = call.y;
    p.fold = call.fold;
    // The schedule came from the permute, which GEMM1 waited for before
    // any dependent could launch; the finalize launches during the tail.
    p.prefetch_before_wait = plan.read_before_wait;
    p.early_dependents = plan.read_before_wait;
    p.tile_m = plan.tile_m;
    p.pipelined = plan.w4_pipeline;
    launch_w4_stream_gemm(p, KernelStream(stream, plan.pdl));
  }

  // GEMM2's epilogue adds b2.
  const float* finalize_b2() const override { return nullptr; }
  // The 16-row form folds the finalize (the launcher refuses the others).
  bool folds_finalize() const override { return true; }

 private:
  void carve(WorkspaceCarver& c, int block, const ExpertWeights& w) {
    const std::size_t e = e_local_;
    w13_.codes = c.take<uint8_t>(e * n1_ * hidden_ / 2);
    w13_.scales = c.take<uint8_t>(e * n1_ * scale_stride(hidden_, block));
    w2_.codes = c.take<uint8_t>(e * hidden_ * inter_ / 2);
    w2_.scales = c.take<uint8_t>(e * hidden_ * scale_stride(inter_, block));
    b13_ = c.take<float>(w.w13_interleaved && w.b13 ? e * n1_ : 0);
  }

  // A prepared row's scale bytes, padded to what the kernel's rows form copies.
  static int scale_stride(int cols, int block) {
    const int m = w4_scale_stride_multiple;
    return (cols / block + m - 1) / m * m;
  }

  void require_weights() const {
    if (!prepared_)
      throw std::runtime_error("the stream path's 4-bit weights were not prepared (set_weights)");
  }

  W4StreamGemmParams common(const ExpertsCall& call) const {
    W4StreamGemmParams p;
    p.format = format_;
    p.tiles = call.tiles;
    p.num_tiles = call.num_tiles;
    p.max_tiles = call.max_tiles;
    return p;
  }

  MoEConfig config_;
  W4Format format_;
  int e_local_, hidden_, inter_, n1_;
  ExpertWeights weights_{};
  void* prepared_ = nullptr;
  std::size_t prepared_bytes_ = 0;
  PreparedMatrix w13_, w2_;
  float* b13_ = nullptr;  // interleaved checkpoints: b13 in gate-then-up order
};

}  // namespace

std::unique_ptr<ExpertsBackend> make_w4_experts_backend(ExpertsPath p, const MoEConfig& config) {
  if (p == ExpertsPath::Stream) return std::make_unique<W4StreamBackend>(config);
  return nullptr;
}

}  // namespace unimoe
