#include "layer/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/weight_fields.h"
#include "kernels/common/common.cuh"
#include "kernels/routing/fused_routing.cuh"
#include "kernels/gemm/gemm2_combine.cuh"
#include "kernels/gemm/grouped_gemm.cuh"
#include "kernels/routing/routing.cuh"
#include "layer/layer_access.h"
#include "layer/workspace_carver.h"

namespace unimoe {
namespace {

constexpr int kSmallestTileM = 16;

// The kernels move x, out and weights 16 bytes at a time (and TMA needs
// 16-byte rows), the fp32/int32 arrays 4 at a time and the 4-bit block
// scales a byte at a time: a pointer that is not aligned so is refused here
// rather than faulting on the device.
void require_aligned(const void* p, std::size_t bytes, const char* field) {
  if (p != nullptr && reinterpret_cast<std::uintptr_t>(p) % bytes != 0)
    throw Error(field, "is not " + std::to_string(bytes) +
                           "-byte aligned; the kernels need it (cudaMalloc'd memory is)");
}

}  // namespace

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::Routing: return "routing";
    case Stage::Permute: return "permute";
    case Stage::Gemm1: return "gemm1";
    case Stage::Gemm2: return "gemm2";
    case Stage::Finalize: return "finalize";
  }
  return "?";
}

namespace {

// The backend of path p, if the config's backend option allows it and it
// serves the config on this device.
std::unique_ptr<ExpertsBackend> usable_backend(ExpertsPath p, const MoEConfig& config,
                                               int max_tokens, const DeviceArch& arch) {
  if (!backend_allows(config.options.backend, p)) return nullptr;
  std::unique_ptr<ExpertsBackend> backend = make_experts_backend(p, config, max_tokens, arch.sm_count);
  if (!backend->supports(config, arch).empty()) return nullptr;
  return backend;
}

}  // namespace

void MoELayerImpl::carve_arena(WorkspaceCarver& c) {
  const int k = config_.routing.top_k, e_local = config_.local_experts();
  const std::size_t rows = static_cast<std::size_t>(max_tokens_) * k;
  topk_ids_ = c.take<int32_t>(rows);
  topk_weights_ = c.take<float>(rows);
  expert_counts_ = c.take<int32_t>(e_local);
  expert_offsets_ = c.take<int32_t>(e_local + 1);
  permuted_to_expanded_ = c.take<int32_t>(rows);
  expanded_to_permuted_ = c.take<int32_t>(rows);
  tiles_ = c.take<DeviceTile>(max_tiles(static_cast<int>(rows), e_local, kSmallestTileM));
  num_tiles_ = c.take<int32_t>(1);
  // The FP8 backends keep their activation (fp32, then e4m3) themselves;
  // BF16 and the W4A16 variants use this bf16 one.
  const QuantVariant quant = config_.experts.quant;
  const bool fp8 = quant == QuantVariant::FP8Block128 || quant == QuantVariant::FP8PerTensor;
  act_ = c.take<uint16_t>(fp8 ? 0 : rows * config_.experts.intermediate);
  y_ = c.take<uint16_t>(rows * config_.experts.hidden);
  gate_record_ = c.take<Gemm2GateRecord>(1);
  permute_scratch_ = c.take<char>(permute_scratch_bytes(max_tokens_, k, e_local));
}

std::size_t MoELayerImpl::scratch_bytes(const MoEConfig& config, int max_tokens) {
  validate(config);
  check_backend_name(config.options.backend);
  if (max_tokens < 1) throw Error("max_tokens", "is " + std::to_string(max_tokens) + "; must be >= 1");
  if (const std::string why = gpu_unsupported_reason(config); !why.empty())
    throw std::runtime_error(why);
  MoELayerImpl sizing(SizingOnly{}, config, max_tokens);
  WorkspaceCarver dry(nullptr);
  sizing.carve_arena(dry);
  // Every backend the layer may come to hold (a tuned choice can take any
  // the option allows), but only one runs at a time: they share the rest.
  const DeviceArch arch = current_device_arch();
  std::size_t backends = 0;
  for (ExpertsPath p : kExpertsPaths)
    if (std::unique_ptr<ExpertsBackend> b = usable_backend(p, config, max_tokens, arch))
      backends = std::max(backends, b->scratch_bytes());
  return dry.used() + backends;
}

MoELayerImpl::MoELayerImpl(const MoEConfig& config, int max_tokens, const DevOverrides& dev,
                           const ScratchBuffer* scratch)
    : config_(config), max_tokens_(max_tokens), dev_(dev) {
  validate(config_);
  check_backend_name(config_.options.backend);
  if (max_tokens < 1) throw Error("max_tokens", "is " + std::to_string(max_tokens) + "; must be >= 1");
  if (const std::string why = gpu_unsupported_reason(config_); !why.empty())
    throw std::runtime_error(why);
  sm_count_ = current_device_sm_count();
  gate_model_ = gemm2_gate_model(config_);
  probe_routing_device_caps(config_.routing, routing_caps_);
  if (config_.options.backend != "auto") {
    const ExpertsPath forced = parse_experts_path(config_.options.backend);
    if (const std::string why = make_experts_backend(forced, config_, max_tokens_, sm_count_)
                                    ->supports(config_, current_device_arch());
        !why.empty())
      throw Error("options.backend", why);
  }
  WorkspaceCarver dry(nullptr);
  carve_arena(dry);
  arena_bytes_ = dry.used();
  char* base = nullptr;
  if (scratch) {
    const std::size_t need = scratch_bytes(config_, max_tokens_);
    check_scratch(*scratch, need, max_tokens_, "MoELayer::scratch_bytes");
    base = static_cast<char*>(scratch->ptr);
    // Zeroed once, as the layer's own arena is (below).
    UNIMOE_CUDA_CHECK(cudaMemset(base, 0, need));
    backend_scratch_ = base + arena_bytes_;
  } else {
    UNIMOE_CUDA_CHECK(cudaMalloc(&arena_, arena_bytes_));
    base = static_cast<char*>(arena_);
  }
  try {
    if (arena_) {
      // Zeroed once, so that no byte of the workspace is ever read unset:
      // compute-sanitizer's initcheck does not see the CUTLASS GEMM's TMA
      // stores as writes, and reported the finalize's reads of y (measured
      // on an H100; the values were right). Forwards never clear it.
      UNIMOE_CUDA_CHECK(cudaMemset(arena_, 0, arena_bytes_));
    }
    // The memset runs on the legacy stream, which a forward on a
    // non-blocking stream does not wait for: done before create returns.
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    WorkspaceCarver real(base);
    carve_arena(real);
    // The backends options.backend allows and that serve the config: those
    // without buffers of their own always; one with buffers only when some
    // call size may take it by the rule, else when a tuned choice first
    // takes it (set_tuned). The rule's path moves one way as rows per
    // expert grow (stream, mma, cutlass; stream, cutlass for FP8), so the
    // paths at 1 and at max_tokens tokens bound those it takes.
    const ExpertsPath smallest = plan_for_tokens(config_, 1).path;
    const ExpertsPath largest = plan_for_tokens(config_, max_tokens).path;
    const DeviceArch arch = current_device_arch();
    for (ExpertsPath p : kExpertsPaths) {
      std::unique_ptr<ExpertsBackend> backend = usable_backend(p, config_, max_tokens_, arch);
      if (!backend) continue;
      if (backend->scratch_bytes() == 0 || p == smallest || p == largest)
        keep_backend(std::move(backend));
    }
    // The folded finalize's column-block counters persist between calls
    // (each call leaves them zero), so never in a shared scratch: the
    // FP8 and 4-bit stream GEMM2 fold it.
    const QuantVariant quant = config_.experts.quant;
    if (quant != QuantVariant::BF16) {
      UNIMOE_CUDA_CHECK(cudaMalloc(&fold_counters_, fold_counters_bytes()));
      UNIMOE_CUDA_CHECK(cudaMemset(fold_counters_, 0, fold_counters_bytes()));
      UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    }
  } catch (...) {
    // The destructor does not run for a constructor that throws.
    if (arena_) cudaFree(arena_);
    if (fold_counters_) cudaFree(fold_counters_);
    throw;
  }
}

MoELayerImpl::~MoELayerImpl() {
  if (arena_) cudaFree(arena_);
  if (fold_counters_) cudaFree(fold_counters_);
}

std::size_t MoELayerImpl::fold_counters_bytes() const {
  // One int per GEMM2 column block: at least 8 columns each.
  return sizeof(int32_t) * static_cast<std::size_t>(ceil_div(config_.experts.hidden, 8));
}

std::size_t MoELayerImpl::workspace_bytes() const {
  std::size_t bytes = (arena_ ? arena_bytes_ : 0) + (fold_counters_ ? fold_counters_bytes() : 0);
  for (const std::unique_ptr<ExpertsBackend>& b : backends_)
    if (b) bytes += b->workspace_bytes();
  return bytes;
}

void MoELayerImpl::keep_backend(std::unique_ptr<ExpertsBackend> backend) {
  backend->allocate_workspace(backend_scratch_);
  // Its buffers' zeroing (legacy stream) is complete before any forward.
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  if (weights_.w13) backend->prepare_weights(weights_);
  backends_[static_cast<std::size_t>(backend->path())] = std::move(backend);
}

void MoELayerImpl::ensure_backend(ExpertsPath p) {
  if (!backends_[static_cast<std::size_t>(p)])
    keep_backend(make_experts_backend(p, config_, max_tokens_, sm_count_));
}

ExpertsBackend& MoELayerImpl::backend_for(ExpertsPath p) {
  const std::unique_ptr<ExpertsBackend>& b = backends_[static_cast<std::size_t>(p)];
  if (!b)
    throw std::runtime_error(std::string("the ") + path_name(p) +
                             " path's backend and buffers were not made for this layer");
  return *b;
}

TuningDevice current_tuning_device() {
  int device = 0;
  UNIMOE_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  UNIMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  TuningDevice d;
  d.gpu_name = prop.name;
  d.sm_count = prop.multiProcessorCount;
  d.cuda_version = CUDART_VERSION;
  return d;
}

DeviceArch current_device_arch() {
  int device = 0;
  UNIMOE_CUDA_CHECK(cudaGetDevice(&device));
  DeviceArch a;
  UNIMOE_CUDA_CHECK(cudaDeviceGetAttribute(&a.major, cudaDevAttrComputeCapabilityMajor, device));
  UNIMOE_CUDA_CHECK(cudaDeviceGetAttribute(&a.minor, cudaDevAttrComputeCapabilityMinor, device));
  a.sm_count = current_device_sm_count();
  return a;
}

void MoELayerImpl::set_tuned(int bucket, const TuningChoice& choice) {
  check_token_bucket(bucket);
  // Refuses a choice the config's backend option forbids, before keeping it.
  plan_for_tokens(config_, bucket, &choice);
  ensure_backend(choice.path);
  tuned_[bucket] = choice;
}

std::optional<TuningChoice> MoELayerImpl::tuned_choice(int bucket) const {
  const auto it = tuned_.find(bucket);
  if (it == tuned_.end()) return std::nullopt;
  return it->second;
}

void MoELayerImpl::clear_tuned(int bucket) { tuned_.erase(bucket); }

std::string MoELayerImpl::use_tuning_cache(const std::string& path) {
  const TuningDevice device = current_tuning_device();
  const TuningCache cache = TuningCache::load(path, device);
  const TuningKey key = TuningKey::make(device, config_);
  std::string report;
  for (const std::string& m : cache.messages()) report += m + "\n";
  int used = 0, buckets = 0;
  for (int bucket : token_buckets(max_tokens_)) {
    ++buckets;
    const std::optional<TuningChoice> choice = cache.find(key, bucket);
    if (!choice) continue;
    if (!backend_allows(config_.options.backend, choice->path)) {
      report += "bucket " + std::to_string(bucket) + ": cached winner takes the " +
                path_name(choice->path) + " path, which options.backend '" +
                config_.options.backend + "' forbids: not used\n";
      continue;
    }
    set_tuned(bucket, *choice);
    ++used;
  }
  report += "tuning cache " + path + ": winners for " + std::to_string(used) + " of " +
            std::to_string(buckets) + " token buckets used; the others follow the rule";
  return report;
}

const TuningChoice* MoELayerImpl::tuned_for(int num_tokens) const {
  const auto it = tuned_.find(token_bucket(num_tokens));
  return it == tuned_.end() ? nullptr : &it->second;
}

void MoELayerImpl::set_weights(const ExpertWeights& w) {
  if (!w.w13 || !w.w2) throw Error("weights", "w13 and w2 must be set");
  if (config_.experts.has_bias && (!w.b13 || !w.b2))
    throw Error("weights", "config has expert biases (has_bias): b13 and b2 must be set");
  require_aligned(w.w13, 16, "weights.w13");
  require_aligned(w.w2, 16, "weights.w2");
  require_aligned(w.b13, 16, "weights.b13");
  require_aligned(w.b2, 16, "weights.b2");
  check_quant_weights(w);
  // What every backend's kernels need is checked above; each backend keeps
  // its own layout of the weights.
  for (const std::unique_ptr<ExpertsBackend>& b : backends_)
    if (b) b->prepare_weights(w);
  weights_ = w;
}

void MoELayerImpl::check_quant_weights(const ExpertWeights& w) const {
  check_quant_weight_fields(config_, w);
  // The block scales (bytes) are read a byte at a time by the 4-bit
  // weight preparation; the fp32 scales (FP8's, NVFP4's matrix scales) a
  // float at a time by every kernel (the CUTLASS blockwise mainloop's
  // 4-byte cp.async included), so that a rank's slice of a model's scales
  // (slice_experts) serves wherever it starts.
  require_aligned(w.w13_scale, 4, "weights.w13_scale");
  require_aligned(w.w2_scale, 4, "weights.w2_scale");
  require_aligned(w.x_scale, 4, "weights.x_scale");
  require_aligned(w.act_scale, 4, "weights.act_scale");
  // A static activation scale divides every element it quantizes: 0, a
  // negative, an infinite or a NaN scale would make every code wrong
  // without an error. set_weights is host-side set-up, so the two floats
  // are read back here (after the device's pending work, which may still
  // be writing them).
  const std::pair<const float*, const char*> statics[] = {{w.x_scale, "weights.x_scale"},
                                                          {w.act_scale, "weights.act_scale"}};
  for (const auto& [scale, field] : statics) {
    if (!scale) continue;
    float value = 0.0f;
    const cudaError_t sync = cudaDeviceSynchronize();
    const cudaError_t copy =
        sync == cudaSuccess ? cudaMemcpy(&value, scale, sizeof value, cudaMemcpyDeviceToHost) : sync;
    if (copy != cudaSuccess)
      throw Error(field, std::string("could not be read as a device float: ") + cudaGetErrorString(copy));
    if (!(value > 0.0f) || !std::isfinite(value))
      throw Error(field, "is " + std::to_string(value) +
                             "; a static activation scale must be a positive, finite float");
  }
}

ref::ActivationScales MoELayerImpl::dynamic_activation_scales(int num_tokens, bool precomputed) {
  ref::ActivationScales s;
  const float* device = backend_for(plan_for(num_tokens, precomputed).path).dynamic_activation_scales();
  if (device == nullptr) return s;
  float both[2];
  UNIMOE_CUDA_CHECK(cudaMemcpy(both, device, sizeof both, cudaMemcpyDeviceToHost));
  s.x = both[0];
  s.act = both[1];
  return s;
}

bool MoELayerImpl::precomputed(const ForwardArgs& args) const {
  return args.topk_ids != nullptr && args.topk_weights != nullptr;
}

void MoELayerImpl::check_args(const ForwardArgs& a) const {
  if (a.num_tokens < 0 || a.num_tokens > max_tokens_)
    throw Error("num_tokens", "is " + std::to_string(a.num_tokens) + "; allowed: 0.." +
                                  std::to_string(max_tokens_) + " (the layer's max_tokens)");
  if (!a.x || !a.out) throw Error("args", "x and out must be set");
  if ((a.topk_ids == nullptr) != (a.topk_weights == nullptr))
    throw Error("args", "precomputed routing needs both topk_ids and topk_weights");
  if (!precomputed(a) && !a.logits) throw Error("args", "logits must be set (or topk_ids and topk_weights)");
  if (!precomputed(a) && config_.routing.has_bias && !a.routing_bias)
    throw Error("routing_bias", "the config has a routing bias (has_bias): pass it");
  if (!weights_.w13) throw Error("weights", "set_weights was not called");
  require_aligned(a.x, 16, "args.x");
  require_aligned(a.out, 16, "args.out");
  require_aligned(a.logits, config_.routing.logits_type == LogitsType::BF16 ? 2 : 4, "args.logits");
  require_aligned(a.routing_bias, 4, "args.routing_bias");
  require_aligned(a.topk_ids, 4, "args.topk_ids");
  require_aligned(a.topk_weights, 4, "args.topk_weights");
}

LayerPlan MoELayerImpl::plan_for(int num_tokens, bool precomputed) const {
  return plan_layer(config_, num_tokens, precomputed, routing_caps_, dev_, tuned_for(num_tokens));
}

std::string MoELayerImpl::describe(int num_tokens) const {
  const LayerPlan plan = plan_for(num_tokens);
  return plan.to_string() + " " + plan.routing.to_string();
}

FinalizeParams MoELayerImpl::finalize_params(const ForwardArgs& a, const float* weights,
                                             const int32_t* ids, const LayerPlan& plan) {
  FinalizeParams p;
  p.y = y_;
  p.expanded_to_permuted = expanded_to_permuted_;
  p.topk_weights = weights;
  p.num_tokens = a.num_tokens;
  p.top_k = config_.routing.top_k;
  p.hidden = config_.experts.hidden;
  p.out = static_cast<uint16_t*>(a.out);
  p.routing_ready_before_wait = plan.read_before_wait;  // routing ran before GEMM1
  if (const float* b2 = backend_for(plan.path).finalize_b2()) {
    p.b2 = b2;
    p.topk_ids = ids;
    p.local_offset = config_.experts.local_expert_offset;
  }
  return p;
}

CombineGemm2Params MoELayerImpl::combine_params(const ForwardArgs& a, const float* weights,
                                               const LayerPlan& plan) {
  CombineGemm2Params c;
  c.act = act_;
  c.w2 = static_cast<const uint16_t*>(weights_.w2);
  c.b2 = weights_.b2;
  c.tiles = tiles_;
  c.num_tiles = plan.gemm2_mode == Gemm2Mode::Gate ? &gate_record_->combine_tiles : num_tiles_;
  c.expanded_to_permuted = expanded_to_permuted_;
  c.topk_weights = weights;
  c.num_tokens = a.num_tokens;
  c.top_k = config_.routing.top_k;
  c.hidden = config_.experts.hidden;
  c.intermediate = config_.experts.intermediate;
  c.out = static_cast<uint16_t*>(a.out);
  // The combine path alone writes a call's zeros; gated, the gate sends a
  // call with no tile to the finalize.
  c.zeros_when_empty = plan.gemm2_mode == Gemm2Mode::Combine;
  return c;
}

void MoELayerImpl::run_stage(Stage stage, const ForwardArgs& a, cudaStream_t stream) {
  const int t = a.num_tokens, k = config_.routing.top_k;
  const int e_local = config_.local_experts();
  const int rows = t * k;
  const int32_t* ids = precomputed(a) ? a.topk_ids : topk_ids_;
  const float* weights = precomputed(a) ? a.topk_weights : topk_weights_;
  const LayerPlan plan = plan_for(t, precomputed(a));
  const int tiles_cap = max_tiles(rows, e_local, plan.tile_m);
  // The fused kinds route and permute in the Routing stage; the Permute
  // stage then launches nothing.
  const KernelStream chain(stream, plan.pdl);
  auto routing_params = [&] {
    RoutingParams p;
    p.logits = precomputed(a) ? nullptr : a.logits;
    p.bias = a.routing_bias;
    p.num_tokens = t;
    p.config = config_.routing;
    p.topk_ids = topk_ids_;
    p.topk_weights = topk_weights_;
    return p;
  };
  auto permute_params = [&] {
    PermuteParams p;
    p.topk_ids = ids;
    p.num_tokens = t;
    p.top_k = k;
    p.local_offset = config_.experts.local_expert_offset;
    p.num_local = e_local;
    p.expert_counts = expert_counts_;
    p.expert_offsets = expert_offsets_;
    p.permuted_to_expanded = permuted_to_expanded_;
    p.expanded_to_permuted = expanded_to_permuted_;
    p.num_tile_sizes = 1;
    p.tile_m[0] = plan.tile_m;
    p.tiles[0] = tiles_;
    p.num_tiles[0] = num_tiles_;
    p.scratch = permute_scratch_;
    return p;
  };
  auto experts_call = [&] {
    ExpertsCall c;
    c.x = static_cast<const uint16_t*>(a.x);
    c.num_tokens = t;
    c.permuted_to_expanded = permuted_to_expanded_;
    c.expanded_to_permuted = expanded_to_permuted_;
    c.expert_offsets = expert_offsets_;
    c.tiles = tiles_;
    c.num_tiles = num_tiles_;
    c.max_tiles = tiles_cap;
    c.act = act_;
    c.y = y_;
    return c;
  };
  switch (stage) {
    case Stage::Routing: {
      launch_routing_stage(routing_params(), permute_params(), plan.routing, chain);
      return;
    }
    case Stage::Permute: {
      launch_permute_stage(permute_params(), plan.routing, chain);
      if (plan.gemm2_mode == Gemm2Mode::Gate && t > 0) {
        Gemm2GateParams g;
        g.expert_counts = expert_counts_;
        g.num_local = e_local;
        g.num_tiles = num_tiles_;
        g.model = gate_model_;
        g.record = gate_record_;
        launch_gemm2_gate(g, chain);
      }
      return;
    }
    case Stage::Gemm1: {
      if (t == 0) return;
      backend_for(plan.path).run_gemm1(experts_call(), plan, stream);
      return;
    }
    case Stage::Gemm2: {
      if (t == 0) return;
      if (plan.finalize_in_gemm2) {
        ExpertsBackend& backend = backend_for(plan.path);
        if (!backend.folds_finalize() || fold_counters_ == nullptr)
          throw std::logic_error(std::string("the ") + path_name(plan.path) +
                                 " path cannot fold the finalize into GEMM2 for this layer");
        ExpertsCall call = experts_call();
        call.fold.finalize = finalize_params(a, weights, ids, plan);
        call.fold.counters = fold_counters_;
        backend.run_gemm2(call, plan, stream);
        return;
      }
      if (plan.gemm2_mode == Gemm2Mode::Combine) {
        launch_combine_gemm2(combine_params(a, weights, plan), false, chain);
        return;
      }
      ExpertsCall call = experts_call();
      // Gated: the gate's count, 0 where it chose the combine (then this
      // GEMM2 returns after its wait and the tail runs the combine).
      if (plan.gemm2_mode == Gemm2Mode::Gate) call.num_tiles = &gate_record_->expert_tiles;
      backend_for(plan.path).run_gemm2(call, plan, stream);
      return;
    }
    case Stage::Finalize: {
      if (t == 0 || plan.gemm2_mode == Gemm2Mode::Combine || plan.finalize_in_gemm2) return;
      if (plan.gemm2_mode == Gemm2Mode::Gate) {
        // The gated tail: the combine, or the finalize where the gate chose
        // the expert path (its flag).
        CombineGemm2Params c = combine_params(a, weights, plan);
        c.tail_finalize = &gate_record_->finalize;
        c.finalize = finalize_params(a, weights, ids, plan);
        launch_combine_gemm2(c, false, chain);
        return;
      }
      launch_finalize(finalize_params(a, weights, ids, plan), chain);
      return;
    }
  }
}

void MoELayerImpl::forward(const ForwardArgs& args, CUstream_st* stream) {
  check_args(args);
  for (Stage s : kStages) run_stage(s, args, stream);
}

void check_scratch(const ScratchBuffer& scratch, std::size_t need, int max_tokens,
                   const char* sizer) {
  const auto address = reinterpret_cast<std::uintptr_t>(scratch.ptr);
  if (!scratch.ptr) throw Error("scratch", "is null");
  if (address % WorkspaceCarver::kAlign != 0)
    throw Error("scratch", "is not " + std::to_string(WorkspaceCarver::kAlign) +
                               "-byte aligned (cudaMalloc'd memory is)");
  if (scratch.bytes < need)
    throw Error("scratch", "has " + std::to_string(scratch.bytes) + " bytes; this config at max_tokens " +
                               std::to_string(max_tokens) + " needs " + std::to_string(need) + " (" +
                               sizer + ")");
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, scratch.ptr) != cudaSuccess ||
      (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)) {
    cudaGetLastError();
    throw Error("scratch", "is not device memory");
  }
  int device = 0;
  UNIMOE_CUDA_CHECK(cudaGetDevice(&device));
  if (attr.device != device)
    throw Error("scratch", "is memory of device " + std::to_string(attr.device) +
                               "; the layer is made on device " + std::to_string(device));
}

std::unique_ptr<MoELayer> MoELayer::create(const MoEConfig& config, int max_tokens) {
  return std::make_unique<MoELayerImpl>(config, max_tokens, DevOverrides::from_environment());
}

std::size_t MoELayer::scratch_bytes(const MoEConfig& config, int max_tokens) {
  return MoELayerImpl::scratch_bytes(config, max_tokens);
}

std::unique_ptr<MoELayer> MoELayer::create(const MoEConfig& config, int max_tokens, void* scratch,
                                           std::size_t scratch_size) {
  const ScratchBuffer buffer{scratch, scratch_size};
  return std::make_unique<MoELayerImpl>(config, max_tokens, DevOverrides::from_environment(),
                                        &buffer);
}

}  // namespace unimoe

namespace unimoe::layer_access {

std::unique_ptr<MoELayer> create(const MoEConfig& config, int max_tokens, const DevOverrides& dev) {
  return std::make_unique<MoELayerImpl>(config, max_tokens, dev);
}

std::unique_ptr<MoELayer> create(const MoEConfig& config, int max_tokens, const DevOverrides& dev,
                                 void* scratch, std::size_t scratch_size) {
  const ScratchBuffer buffer{scratch, scratch_size};
  return std::make_unique<MoELayerImpl>(config, max_tokens, dev, &buffer);
}

MoELayerImpl& impl(MoELayer& layer) { return static_cast<MoELayerImpl&>(layer); }
const MoELayerImpl& impl(const MoELayer& layer) { return static_cast<const MoELayerImpl&>(layer); }

}  // namespace unimoe::layer_access
