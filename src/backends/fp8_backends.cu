// The FP8 experts backends (FP8Block128 and FP8PerTensor; the contract is
// ExpertsBackend's, backends/experts_backend.h):
//   Fp8StreamBackend (Stream path, decode; Mma path, prefill): x quantized
//     once per token, the FP8 stream kernel (Stream) or the FP8 wgmma
//     kernel over 128-row tiles (Mma) for GEMM1 (x rows gathered on load, bias and
//     activation in registers, fp32 out), the activation quantized, the FP8
//     stream kernel for GEMM2 (b2 in its epilogue, bf16 y);
//   Fp8CutlassBackend (Cutlass path, prefill): x quantized once per token,
//     its codes and scales written to the token's permuted rows as they
//     are made (FP8PerTensor's dynamic scale made first by an amax pass
//     over x; with the knob fp8_tensor_scale_first=0, quantized in token
//     order and gathered instead),
//     CUTLASS's blockwise-scaled grouped GEMM for GEMM1 (fp32 out: rounding
//     it to bf16 moved about one intermediate element in 30 to the
//     neighbouring e4m3 code, 1.4e-2 to 3.9e-2 of relative error on an H100
//     against 2.4e-3 on the stream path), the activation and its
//     quantization (one kernel, but for FP8PerTensor's dynamic scale: the
//     activation kernel writes the fp32 activation and its CTAs' maxima,
//     which give the scale in one block, and one pass quantizes; with
//     fp8_tensor_scale_first=0 the dynamic quantize kernels run on the
//     fp32 activation), the same GEMM for GEMM2 (bf16 out); the
//     finalize adds b2. Development knobs fp8_quant_scatter=0 and
//     fp8_act_quant_fused=0 keep the earlier forms (quantize in token
//     order and gather; the activation, then the quantize kernels).
// Both GEMMs take one fp32 scale per row and 128-wide K block of their
// input (group-major: scale(r, g) at scales[g * ld + r]) and one per
// 128 x 128 block of the weights. FP8Block128 computes those per call
// (activations) and reads the checkpoint's (weights); FP8PerTensor's one
// activation scale (dynamic, or the static one given) is broadcast to every
// (row, group) by its quantize kernel, and its per-expert weight scales are
// expanded to the block layout once, in prepare_weights.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>

#include "backends/experts_backend.h"
#include "kernels/common/common.cuh"
#include "kernels/gemm/sm90_fp8_grouped_gemm.cuh"
#include "kernels/gemm/sm90_fp8_wgmma_gemm.cuh"
#include "kernels/gemm/stream_gemm_fp8.cuh"
#include "kernels/permute/expert_rows.cuh"
#include "kernels/quant/fp8_quant.cuh"
#include "layer/workspace_carver.h"

namespace unimoe {
namespace {

constexpr int kBlock = 128;  // the FP8 scale block along K (and along N for weights)

// Scale arrays' leading dimension: rows rounded up to 4 floats (16 bytes).
int scales_ld(std::size_t rows) { return static_cast<int>((rows + 3) / 4 * 4); }

// scales[e, nb, kb] = per_expert[e] for every block of expert e's matrix.
__global__ void expand_expert_scales_kernel(const float* __restrict__ per_expert, int blocks,
                                            std::size_t total, float* __restrict__ out) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[i] = per_expert[i / blocks];
}

// set_weights is host-side set-up: the device is synchronized before (the
// caller may have written the scales on any stream) and after (the expanded
// scales are complete before any forward, on any stream, reads them).
void expand_expert_scales(const float* per_expert, int experts, int blocks, float* out) {
  const std::size_t total = static_cast<std::size_t>(experts) * blocks;
  if (total == 0) return;
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const int threads = 256;
  const int grid = static_cast<int>(std::min<std::size_t>((total + threads - 1) / threads, 4096));
  expand_expert_scales_kernel<<<grid, threads>>>(per_expert, blocks, total, out);
  UNIMOE_LAUNCH_CHECK();
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

// What both FP8 backends share: the per-call activation quantization and
// the weights' scales in block layout.
class Fp8Backend : public ExpertsBackend {
 public:
  ~Fp8Backend() override {
    if (arena_) cudaFree(arena_);
    if (expanded_) cudaFree(expanded_);
  }

  void prepare_weights(const ExpertWeights& weights) override {
    weights_ = weights;
    w13_scales_ = weights.w13_scale;
    w2_scales_ = weights.w2_scale;
    if (per_tensor()) {
      require_workspace();
      expand_expert_scales(weights.w13_scale, e_local_, w13_blocks(), w13_expanded_);
      expand_expert_scales(weights.w2_scale, e_local_, w2_blocks(), w2_expanded_);
      w13_scales_ = w13_expanded_;
      w2_scales_ = w2_expanded_;
    }
  }

  std::size_t scratch_bytes() const override { return bytes_; }
  std::size_t workspace_bytes() const override {
    return (arena_ ? bytes_ : 0) + (expanded_ ? expanded_bytes() : 0);
  }

  const float* dynamic_activation_scales() const override {
    return per_tensor() && !weights_.x_scale && !weights_.act_scale ? tensor_scales_ : nullptr;
  }

  void allocate_workspace(char* scratch) override {
    if (placed_) return;
    if (per_tensor()) {
      // The expanded weight scales outlive a call: never in the scratch.
      UNIMOE_CUDA_CHECK(cudaMalloc(&expanded_, expanded_bytes()));
      WorkspaceCarver e(static_cast<char*>(expanded_));
      w13_expanded_ = e.take<float>(static_cast<std::size_t>(e_local_) * w13_blocks());
      w2_expanded_ = e.take<float>(static_cast<std::size_t>(e_local_) * w2_blocks());
    }
    if (!scratch) {
      UNIMOE_CUDA_CHECK(cudaMalloc(&arena_, bytes_));
      // Once, so that nothing is ever read unset (initcheck does not see
      // the CUTLASS GEMM's TMA stores); forwards never clear it. A caller's
      // scratch the layer zeroes at creation.
      UNIMOE_CUDA_CHECK(cudaMemset(arena_, 0, bytes_));
      scratch = static_cast<char*>(arena_);
    }
    WorkspaceCarver real(scratch);
    carve(real);
    placed_ = true;
  }

 protected:
  Fp8Backend(ExpertsPath path, const MoEConfig& config, int max_tokens)
      : ExpertsBackend(path),
        config_(config),
        max_tokens_(max_tokens),
        e_local_(config.local_experts()),
        hidden_(config.experts.hidden),
        inter_(config.experts.intermediate),
        n1_(config.gemm1_cols()),
        max_rows_(static_cast<std::size_t>(max_tokens) * config.routing.top_k),
        x_ld_(scales_ld(max_tokens)),
        rows_ld_(scales_ld(max_rows_)) {}

  // Sizes the arena (call at the end of the derived constructor).
  void size_workspace() {
    WorkspaceCarver dry(nullptr);
    carve(dry);
    bytes_ = dry.used();
  }

  // The derived backend's own buffers, after the shared ones.
  virtual void carve_own(WorkspaceCarver& c) = 0;

  bool per_tensor() const { return config_.experts.quant == QuantVariant::FP8PerTensor; }
  int w13_blocks() const { return (n1_ / kBlock) * (hidden_ / kBlock); }
  int w2_blocks() const { return (hidden_ / kBlock) * (inter_ / kBlock); }

  std::size_t expanded_bytes() const {
    WorkspaceCarver dry(nullptr);
    dry.take<float>(static_cast<std::size_t>(e_local_) * w13_blocks());
    dry.take<float>(static_cast<std::size_t>(e_local_) * w2_blocks());
    return dry.used();
  }

  void require_workspace() const {
    if (!placed_)
      throw std::runtime_error(std::string("the ") + name() +
                               " path's FP8 buffers were not allocated for this layer");
  }

  // x [T, H] bf16 -> x_codes_ [T, H] and x_scales_ (group-major, x_ld_).
  // `early`: the GEMM after it may launch once its wait is over
  // (Fp8RowQuantParams::early_dependents).
  void quantize_x(const ExpertsCall& call, KernelStream stream, bool early = false) {
    if (per_tensor()) {
      Fp8TensorQuantParams q;
      q.x = call.x;
      q.rows = call.num_tokens;
      q.cols = hidden_;
      q.static_scale = weights_.x_scale;
      q.codes = x_codes_;
      q.scale = tensor_scales_;
      q.scratch = x_scratch_;
      q.row_scales = x_scales_;
      q.row_scales_ld = x_ld_;
      q.early_dependents = early;
      launch_quantize_fp8_tensor(q, stream);
    } else {
      Fp8RowQuantParams q;
      q.x = call.x;
      q.rows = call.num_tokens;
      q.cols = hidden_;
      q.codes = x_codes_;
      q.scales = x_scales_;
      q.scales_ld = x_ld_;
      q.early_dependents = early;
      launch_quantize_fp8_rows(q, stream);
    }
  }

  // act_f32_ [rows, I] -> act_codes_ and act_scales_ (group-major, rows_ld_),
  // over the live rows (expert_offsets[E_local]) of a T * K capacity.
  void quantize_act(const ExpertsCall& call, KernelStream stream, bool early = false) {
    const int capacity = call.num_tokens * config_.routing.top_k;
    const int32_t* live = call.expert_offsets + e_local_;
    if (per_tensor()) {
      Fp8TensorQuantParams q;
      q.x_f32 = act_f32_;
      q.rows = capacity;
      q.cols = inter_;
      q.rows_device = live;
      q.static_scale = weights_.act_scale;
      q.codes = act_codes_;
      q.scale = tensor_scales_ + 1;
      q.scratch = act_scratch_;
      q.row_scales = act_scales_;
      q.row_scales_ld = rows_ld_;
      q.early_dependents = early;
      launch_quantize_fp8_tensor(q, stream);
    } else {
      Fp8RowQuantParams q;
      q.x_f32 = act_f32_;
      q.rows = capacity;
      q.cols = inter_;
      q.rows_device = live;
      q.codes = act_codes_;
      q.scales = act_scales_;
      q.scales_ld = rows_ld_;
      q.early_dependents = early;
      launch_quantize_fp8_rows(q, stream);
    }
  }

  MoEConfig config_;
  int max_tokens_;
  int e_local_, hidden_, inter_, n1_;
  std::size_t max_rows_;
  int x_ld_, rows_ld_;
  ExpertWeights weights_{};
  const float* w13_scales_ = nullptr;  // block layout: the checkpoint's, or expanded
  const float* w2_scales_ = nullptr;

  // Shared buffers (pointers into the scratch, but the expanded scales).
  uint8_t* x_codes_ = nullptr;     // [max_tokens, H]
  float* x_scales_ = nullptr;      // [H / 128, x_ld_]
  float* act_f32_ = nullptr;       // [T*K, I] activated GEMM1 output
  uint8_t* act_codes_ = nullptr;   // [T*K, I]
  float* act_scales_ = nullptr;    // [I / 128, rows_ld_]
  float* tensor_scales_ = nullptr; // FP8PerTensor: the scales of x and of the activation, and
                                   // a slot for a copy nothing reads
  float* x_scratch_ = nullptr;     // FP8PerTensor dynamic amax partials
  float* act_scratch_ = nullptr;
  // FP8PerTensor, GEMM1 at one token quantizing in the GEMMs: its CTAs'
  // output maxima (Fp8StreamGemmParams::out_maxima).
  float* act_maxima_ = nullptr;
  // Its size: GEMM1's grid at one token, at most K tiles of ceil(I / 8)
  // column blocks.
  std::size_t maxima_capacity() const {
    return static_cast<std::size_t>(config_.routing.top_k) * ((inter_ + 7) / 8);
  }
  float* w13_expanded_ = nullptr;  // FP8PerTensor: [E_local, n1 / 128, H / 128]
  float* w2_expanded_ = nullptr;   //   [E_local, H / 128, I / 128] (own allocation, persistent)

 private:
  void carve(WorkspaceCarver& c) {
    x_codes_ = c.take<uint8_t>(static_cast<std::size_t>(max_tokens_) * hidden_);
    x_scales_ = c.take<float>(static_cast<std::size_t>(hidden_ / kBlock) * x_ld_);
    act_f32_ = c.take<float>(max_rows_ * inter_);
    act_codes_ = c.take<uint8_t>(max_rows_ * inter_);
    act_scales_ = c.take<float>(static_cast<std::size_t>(inter_ / kBlock) * rows_ld_);
    if (per_tensor()) {
      tensor_scales_ = c.take<float>(3);
      x_scratch_ = c.take<float>(quantize_fp8_tensor_scratch_floats(max_tokens_, hidden_));
      act_scratch_ = c.take<float>(
          quantize_fp8_tensor_scratch_floats(static_cast<int>(max_rows_), inter_));
      act_maxima_ = c.take<float>(maxima_capacity());
    }
    carve_own(c);
  }

  std::size_t bytes_ = 0;      // the per-call buffers
  void* arena_ = nullptr;       // their allocation when the layer gave no scratch
  void* expanded_ = nullptr;    // FP8PerTensor's expanded scales
  bool placed_ = false;         // the buffer pointers are set
};

// The Stream path (the FP8 stream kernel over 16-row tiles) and the Mma
// path (the FP8 wgmma kernel over 128-row tiles): one contract
// (Fp8StreamGemmParams), so one backend with the kernel its path names.
class Fp8StreamBackend final : public Fp8Backend {
 public:
  Fp8StreamBackend(ExpertsPath path, const MoEConfig& config, int max_tokens)
      : Fp8Backend(path, config, max_tokens) {
    size_workspace();
  }

  void run_gemm1(const ExpertsCall& call, const LayerPlan& plan, cudaStream_t stream) override {
    require_workspace();
    const KernelStream chain(stream, plan.pdl);
    // Each GEMM launches as its quantize kernel's wait ends and issues its
    // weight loads while the codes are made (it reads the schedule before
    // its own wait: the quantize kernel waited for the permute or GEMM1).
    const bool early = plan.fp8_quant_early && plan.read_before_wait;
    Fp8StreamGemmParams p = gemm1_shape(call, plan);
    if (plan.fp8_quant_in_gemm) {
      // x quantized by GEMM1 itself (one token): the kernel before it is
      // the permute, which writes the schedule, so it reads the schedule
      // after its wait.
      p.a_bf16 = call.x;
      p.a_row_scale = a_row_scale(weights_.x_scale, /*one_row=*/call.num_tokens == 1);
      p.a_given_scale = weights_.x_scale;
      // The dynamic scale where the quantize kernel leaves it
      // (dynamic_activation_scales reads it).
      if (p.a_row_scale == fp8_encode::RowScale::kRow) p.a_scale_out = tensor_scales_;
      p.prefetch_before_wait = false;
      if (dynamic_act_scale()) {
        // Each CTA's largest output, from which GEMM2 makes the scale.
        p.out_maxima = act_maxima_;
        if (static_cast<std::size_t>(fp8_stream_grid_ctas(p)) > maxima_capacity())
          throw std::logic_error("GEMM1's grid outgrew the activation maxima's buffer");
      }
    } else {
      quantize_x(call, chain, early);
      p.a = x_codes_;
      p.a_scales = x_scales_;
      p.a_scales_ld = x_ld_;
    }
    p.gather = call.permuted_to_expanded;
    p.top_k = config_.routing.top_k;
    p.b = static_cast<const uint8_t*>(weights_.w13);
    p.b_scales = w13_scales_;
    p.bias = weights_.b13;
    p.b_rows = n1_;
    p.up_offset = is_gated(p.epilogue) ? inter_ : 0;
    p.alpha = config_.experts.swiglu_alpha;
    p.limit = config_.experts.swiglu_limit;
    p.out_f32 = act_f32_;
    if (plan.next_prefetch && path() == ExpertsPath::Stream) {
      // GEMM2's e4m3 weights and their block scales of each expert.
      p.next.base = weights_.w2;
      p.next.bytes = static_cast<std::size_t>(hidden_) * inter_;
      p.next.base2 = w2_scales_;
      p.next.bytes2 = sizeof(float) * static_cast<std::size_t>(w2_blocks());
      p.next.max_tiles = next_weights_max_tiles(p.next.bytes + p.next.bytes2);
    }
    launch(p, plan, chain);
    if (!act_quant_in_gemm2(plan)) quantize_act(call, chain, early);
  }

  void run_gemm2(const ExpertsCall& call, const LayerPlan& plan, cudaStream_t stream) override {
    require_workspace();
    Fp8StreamGemmParams p = common(call, plan);
    if (act_quant_in_gemm2(plan)) {
      // The activation quantized by GEMM2 itself; its schedule is as old as
      // before (GEMM1 waited for the permute before letting it launch).
      p.a_f32 = act_f32_;
      if (dynamic_act_scale()) {
        // FP8PerTensor's dynamic scale from GEMM1's CTA maxima.
        p.a_row_scale = fp8_encode::RowScale::kMaxima;
        p.a_given_scale = act_maxima_;
        p.a_maxima = fp8_stream_grid_ctas(gemm1_shape(call, plan));
        p.a_scale_out = tensor_scales_ + 1;  // where dynamic_activation_scales reads it
      } else {
        p.a_row_scale = a_row_scale(weights_.act_scale, /*one_row=*/false);
        p.a_given_scale = weights_.act_scale;
      }
    } else {
      p.a = act_codes_;
      p.a_scales = act_scales_;
      p.a_scales_ld = rows_ld_;
    }
    p.b = static_cast<const uint8_t*>(weights_.w2);
    p.b_scales = w2_scales_;
    p.bias = weights_.b2;
    p.b_rows = hidden_;
    p.k = inter_;
    p.n_out = hidden_;
    p.epilogue = GemmEpilogue::Identity;
    p.out_bf16 = call.y;
    p.fold = call.fold;
    launch(p, plan, KernelStream(stream, plan.pdl));
  }

  // GEMM2's epilogue adds b2.
  const float* finalize_b2() const override { return nullptr; }
  // The stream kernel folds the finalize; the mma path's wgmma kernel does not.
  bool folds_finalize() const override { return path() == ExpertsPath::Stream; }

 private:
  void carve_own(WorkspaceCarver&) override {}

  // GEMM2 quantizes the activation itself where the plan says so (for
  // FP8PerTensor's dynamic scale, from GEMM1's CTA maxima).
  bool act_quant_in_gemm2(const LayerPlan& plan) const { return plan.fp8_quant_in_gemm; }

  bool dynamic_act_scale() const { return per_tensor() && weights_.act_scale == nullptr; }

  // GEMM1's launch shape (what its grid depends on), the rest of the
  // parameters common().
  Fp8StreamGemmParams gemm1_shape(const ExpertsCall& call, const LayerPlan& plan) const {
    Fp8StreamGemmParams p = common(call, plan);
    p.k = hidden_;
    p.n_out = inter_;
    p.epilogue = gemm1_epilogue(config_.experts.activation);
    return p;
  }

  // How a GEMM that quantizes its own A rows takes their scales: per 128
  // columns (FP8Block128), the static scale given, or (FP8PerTensor,
  // dynamic) one over the row, which is the tensor only where it has one
  // row (x at one token).
  fp8_encode::RowScale a_row_scale(const float* static_scale, bool one_row) const {
    if (!per_tensor()) return fp8_encode::RowScale::kGroups;
    if (static_scale != nullptr) return fp8_encode::RowScale::kGiven;
    if (!one_row)
      throw std::logic_error("a dynamic tensor scale over several rows is not made in the GEMM");
    return fp8_encode::RowScale::kRow;
  }

  // The path's kernel; the plan's tactics must be the ones it runs.
  void launch(const Fp8StreamGemmParams& p, const LayerPlan& plan, KernelStream stream) const {
    if (path() == ExpertsPath::Stream) {
      launch_fp8_stream_gemm(p, stream);
      return;
    }
    if (p.fold.counters != nullptr || p.a_bf16 != nullptr || p.a_f32 != nullptr)
      throw std::logic_error("the FP8 mma path neither folds the finalize nor quantizes its input");
    if (plan.tile_m != kFp8WgmmaTileM || plan.gemm1 != kFp8MmaTactic || plan.gemm2 != kFp8MmaTactic)
      throw std::runtime_error("the FP8 mma path runs " + kFp8MmaTactic.to_string() +
                               " for both GEMMs over 128-row tiles; the plan has " + plan.to_string());
    launch_fp8_wgmma_gemm(p, stream);
  }

  // The schedule and the PDL behaviour, as the BF16 stream path's: the tile
  // schedule (and the weights) were complete before the kernel ahead of
  // each GEMM began (that kernel is a quantize kernel, which waited for the
  // permute or GEMM1), so both read them before their wait, and let the
  // next kernel launch once their loads are done.
  Fp8StreamGemmParams common(const ExpertsCall& call, const LayerPlan& plan) const {
    Fp8StreamGemmParams p;
    p.tiles = call.tiles;
    p.num_tiles = call.num_tiles;
    p.max_tiles = call.max_tiles;
    p.prefetch_before_wait = plan.read_before_wait;
    p.early_dependents = plan.read_before_wait;
    p.wide_ctas = plan.fp8_wide_ctas;
    return p;
  }
};

class Fp8CutlassBackend final : public Fp8Backend {
 public:
  Fp8CutlassBackend(const MoEConfig& config, int max_tokens, int sm_count)
      : Fp8Backend(ExpertsPath::Cutlass, config, max_tokens), sm_count_(sm_count) {
    size_workspace();
  }

  void run_gemm1(const ExpertsCall& call, const LayerPlan& plan, cudaStream_t stream) override {
    require_workspace();
    const KernelStream chain(stream, plan.pdl);
    const int capacity = call.num_tokens * config_.routing.top_k;
    // FP8PerTensor's dynamic scales need the whole tensor's amax first; a
    // static scale serves as FP8Block128's per-row scales do.
    const bool dynamic_x = per_tensor() && weights_.x_scale == nullptr;
    const bool dynamic_act = per_tensor() && weights_.act_scale == nullptr;
    if (plan.fp8_quant_scatter && (!dynamic_x || plan.fp8_tensor_scale_first)) {
      // x's codes and scales straight to the permuted rows: no token-order
      // copy, no gather. A dynamic tensor scale is made first (its amax
      // pass over x) and then taken as given.
      const float* x_scale = per_tensor() ? weights_.x_scale : nullptr;
      if (dynamic_x) {
        Fp8TensorQuantParams s;
        s.x = call.x;
        s.rows = call.num_tokens;
        s.cols = hidden_;
        s.scratch = x_scratch_;
        s.scale = tensor_scales_;
        launch_fp8_tensor_scale(s, chain);
        x_scale = tensor_scales_;
      }
      Fp8RowScatterParams q;
      q.x = call.x;
      q.rows = call.num_tokens;
      q.cols = hidden_;
      q.expanded_to_permuted = call.expanded_to_permuted;
      q.top_k = config_.routing.top_k;
      q.capacity = capacity;
      q.codes = gathered_codes_;
      q.scales = gathered_scales_;
      q.scales_ld = rows_ld_;
      q.static_scale = x_scale;
      launch_quantize_fp8_rows_scatter(q, chain);
    } else {
      gather_x(call, capacity, chain);
    }
    run_gemm(call, gathered_codes_, gathered_scales_, weights_.w13, w13_scales_, nullptr, h_, n1_,
             hidden_, plan.sm90_fp8, chain);
    if (!dynamic_act && plan.fp8_act_quant_fused) {
      // The activation and its quantization (per row and 128 columns, or
      // with the static scale) in one kernel: the same codes and scales,
      // no fp32 activation in memory.
      auto act = activation_params<GatedActivationFp8Params>(call, capacity);
      act.out_codes = act_codes_;
      act.out_scales = act_scales_;
      act.out_scales_ld = rows_ld_;
      act.static_scale = per_tensor() ? weights_.act_scale : nullptr;
      launch_gated_activation_fp8(act, chain);
      return;
    }
    // FP8PerTensor's dynamic scale: one amax over all rows, so the
    // activation is complete before its quantization.
    auto act = activation_params<GatedActivationParams>(call, capacity);
    act.out_f32 = act_f32_;
    if (!dynamic_act || !plan.fp8_act_quant_fused || !plan.fp8_tensor_scale_first) {
      launch_gated_activation(act, chain);
      quantize_act(call, chain);
      return;
    }
    // The activation kernel keeps its CTAs' maxima, so the scale needs no
    // pass over the activation; then one quantize pass with that scale.
    act.amax_partials = act_amax_;
    launch_gated_activation(act, chain);
    launch_fp8_scale_from_partials(act_amax_, gated_activation_blocks(capacity), tensor_scales_ + 1,
                                   chain);
    Fp8TensorQuantParams q;
    q.x_f32 = act_f32_;
    q.rows = capacity;
    q.cols = inter_;
    q.rows_device = call.expert_offsets + e_local_;
    q.static_scale = tensor_scales_ + 1;
    q.codes = act_codes_;
    q.scale = tensor_scales_ + 2;  // a copy of the given scale, not read
    q.row_scales = act_scales_;
    q.row_scales_ld = rows_ld_;
    launch_quantize_fp8_tensor(q, chain);
  }

  void run_gemm2(const ExpertsCall& call, const LayerPlan& plan, cudaStream_t stream) override {
    require_workspace();
    run_gemm(call, act_codes_, act_scales_, weights_.w2, w2_scales_, call.y, nullptr, hidden_,
             inter_, plan.sm90_fp8_gemm2, KernelStream(stream, plan.pdl));
  }

  // The grouped GEMM has no bias epilogue: the finalize adds b2 (or nothing).
  const float* finalize_b2() const override { return weights_.b2; }

 private:
  // The activation's input (GEMM1's fp32 h) and settings, for either
  // activation kernel (GatedActivationParams, GatedActivationFp8Params).
  template <typename Params>
  Params activation_params(const ExpertsCall& call, int capacity) const {
    Params p;
    p.h_f32 = h_;
    p.b13 = weights_.b13;
    p.expert_offsets = call.expert_offsets;
    p.num_groups = e_local_;
    p.capacity = capacity;
    p.intermediate = inter_;
    p.activation = config_.experts.activation;
    p.swiglu_alpha = config_.experts.swiglu_alpha;
    p.swiglu_limit = config_.experts.swiglu_limit;
    return p;
  }

  // x quantized in token order, its codes and scales gathered into
  // permuted order (FP8PerTensor; FP8Block128 with fp8_quant_scatter off).
  void gather_x(const ExpertsCall& call, int capacity, KernelStream chain) {
    quantize_x(call, chain);
    GatherFp8RowsParams g;
    g.codes = x_codes_;
    g.scales = x_scales_;
    g.scales_ld = x_ld_;
    g.permuted_to_expanded = call.permuted_to_expanded;
    g.expert_offsets = call.expert_offsets;
    g.num_groups = e_local_;
    g.top_k = config_.routing.top_k;
    g.hidden = hidden_;
    g.capacity = capacity;
    g.out_codes = gathered_codes_;
    g.out_scales = gathered_scales_;
    g.out_scales_ld = rows_ld_;
    launch_gather_fp8_rows(g, chain);
  }

  void carve_own(WorkspaceCarver& c) override {
    gathered_codes_ = c.take<uint8_t>(max_rows_ * hidden_);
    gathered_scales_ = c.take<float>(static_cast<std::size_t>(hidden_ / kBlock) * rows_ld_);
    h_ = c.take<float>(max_rows_ * n1_);
    if (per_tensor())
      act_amax_ = c.take<float>(static_cast<std::size_t>(
          gated_activation_blocks(static_cast<int>(max_rows_))));
    gemm_workspace_ = c.take<char>(sm90_fp8_grouped_gemm_workspace_bytes(e_local_, sm_count_));
  }

  // D is bf16 (d) or fp32 (d_f32).
  void run_gemm(const ExpertsCall& call, const uint8_t* a, const float* a_scales, const void* b,
                const float* b_scales, uint16_t* d, float* d_f32, int n, int k,
                Sm90Fp8GemmTactic tactic, KernelStream stream) const {
    Sm90Fp8GroupedGemmParams p;
    p.a = a;
    p.a_scales = a_scales;
    p.a_scales_ld = rows_ld_;
    p.expert_offsets = call.expert_offsets;
    p.b = static_cast<const uint8_t*>(b);
    p.b_scales = b_scales;
    p.d = d;
    p.d_f32 = d_f32;
    p.num_groups = e_local_;
    p.n = n;
    p.k = k;
    p.workspace = gemm_workspace_;
    p.sm_count = sm_count_;
    p.tactic = tactic;
    launch_sm90_fp8_grouped_gemm(p, stream);
  }

  int sm_count_;
  uint8_t* gathered_codes_ = nullptr;  // [T*K, H] x codes in permuted order
  float* gathered_scales_ = nullptr;   // [H / 128, rows_ld_]
  float* h_ = nullptr;                 // [T*K, gemm1_cols] GEMM1 output before the activation
  float* act_amax_ = nullptr;          // FP8PerTensor: the activation kernel's CTA maxima
  void* gemm_workspace_ = nullptr;
};

}  // namespace

std::unique_ptr<ExpertsBackend> make_fp8_experts_backend(ExpertsPath p, const MoEConfig& config,
                                                         int max_tokens, int sm_count) {
  switch (p) {
    case ExpertsPath::Stream:
    case ExpertsPath::Mma: return std::make_unique<Fp8StreamBackend>(p, config, max_tokens);
    case ExpertsPath::Cutlass:
      return std::make_unique<Fp8CutlassBackend>(config, max_tokens, sm_count);
  }
  return nullptr;
}

}  // namespace unimoe
