#include "layer/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/expert_rows.cuh"
#include "kernels/fused_routing.cuh"
#include "kernels/routing.cuh"

namespace unimoe {
namespace {

constexpr int kSmallestTileM = 16;
constexpr std::size_t kAlign = 256;

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// The kernels move x, out and weights 16 bytes at a time (and TMA needs
// 16-byte rows), and the fp32/int32 arrays 4 at a time: a pointer that is
// not aligned so is refused here rather than faulting on the device.
void require_aligned(const void* p, std::size_t bytes, const char* field) {
  if (p != nullptr && reinterpret_cast<std::uintptr_t>(p) % bytes != 0)
    throw Error(field, "is not " + std::to_string(bytes) +
                           "-byte aligned; the kernels need it (cudaMalloc'd memory is)");
}

// UNIMOE_ROUTING_VARIANT: unset follows the plan's rule; "split" or
// "fused" forces that variant (fused only where the kernel serves the size).
std::optional<RoutingVariant> forced_routing_variant() {
  const char* v = std::getenv("UNIMOE_ROUTING_VARIANT");
  if (v == nullptr || *v == '\0') return std::nullopt;
  return parse_routing_variant(v);
}

// Hands out aligned slices of one allocation: first a dry run to size it.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <typename T>
  T* take(std::size_t count) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += align_up(count * sizeof(T));
    return p;
  }
  std::size_t used() const { return used_; }

 private:
  char* base_;
  std::size_t used_ = 0;
};

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

MoELayerImpl::MoELayerImpl(const MoEConfig& config, int max_tokens)
    : config_(config), max_tokens_(max_tokens), forced_routing_(forced_routing_variant()) {
  validate(config_);
  check_backend_name(config_.options.backend);
  if (max_tokens < 1) throw Error("max_tokens", "is " + std::to_string(max_tokens) + "; must be >= 1");
  if (const std::string why = gpu_unsupported_reason(config_); !why.empty())
    throw std::runtime_error(why);
  if (config_.options.backend != "auto") {
    const ExpertsPath forced = parse_experts_path(config_.options.backend);
    if (const std::string why = backend_unsupported_reason(forced, config_, current_device_arch());
        !why.empty())
      throw Error("options.backend", why);
  }
  const int k = config_.routing.top_k, e_local = config_.local_experts();
  const std::size_t rows = static_cast<std::size_t>(max_tokens) * k;
  int device = 0;
  UNIMOE_CUDA_CHECK(cudaGetDevice(&device));
  UNIMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  auto carve = [&](Carver& c) {
    topk_ids_ = c.take<int32_t>(rows);
    topk_weights_ = c.take<float>(rows);
    expert_counts_ = c.take<int32_t>(e_local);
    expert_offsets_ = c.take<int32_t>(e_local + 1);
    permuted_to_expanded_ = c.take<int32_t>(rows);
    expanded_to_permuted_ = c.take<int32_t>(rows);
    tiles_ = c.take<DeviceTile>(max_tiles(static_cast<int>(rows), e_local, kSmallestTileM));
    num_tiles_ = c.take<int32_t>(1);
    act_ = c.take<uint16_t>(rows * config_.experts.intermediate);
    y_ = c.take<uint16_t>(rows * config_.experts.hidden);
    permute_scratch_ = c.take<char>(permute_scratch_bytes(max_tokens, k, e_local));
  };
  Carver dry(nullptr);
  carve(dry);
  arena_bytes_ = dry.used();
  UNIMOE_CUDA_CHECK(cudaMalloc(&arena_, dry.used()));
  Carver real(static_cast<char*>(arena_));
  carve(real);
  // The Cutlass path's buffers, only when some call size may take it.
  if (plan_for_tokens(config_, max_tokens).path == ExpertsPath::Cutlass)
    ensure_cutlass_buffers();
}

MoELayerImpl::~MoELayerImpl() {
  if (arena_) cudaFree(arena_);
  if (cutlass_arena_) cudaFree(cutlass_arena_);
}

void MoELayerImpl::ensure_cutlass_buffers() {
  if (cutlass_arena_) return;
  const std::size_t rows = static_cast<std::size_t>(max_tokens_) * config_.routing.top_k;
  auto carve = [&](Carver& c) {
    gathered_ = c.take<uint16_t>(rows * config_.experts.hidden);
    h_ = c.take<uint16_t>(rows * config_.gemm1_cols());
    sm90_workspace_ =
        c.take<char>(sm90_grouped_gemm_workspace_bytes(config_.local_experts(), sm_count_));
  };
  Carver dry(nullptr);
  carve(dry);
  cutlass_bytes_ = dry.used();
  UNIMOE_CUDA_CHECK(cudaMalloc(&cutlass_arena_, dry.used()));
  Carver real(static_cast<char*>(cutlass_arena_));
  carve(real);
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
  UNIMOE_CUDA_CHECK(cudaDeviceGetAttribute(&a.sm_count, cudaDevAttrMultiProcessorCount, device));
  return a;
}

void MoELayerImpl::set_tuned(int bucket, const TuningChoice& choice) {
  check_token_bucket(bucket);
  // Refuses a choice the config's backend option forbids, before keeping it.
  plan_for_tokens(config_, bucket, &choice);
  if (choice.path == ExpertsPath::Cutlass) ensure_cutlass_buffers();
  tuned_[bucket] = choice;
}

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
  weights_ = w;
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

LayerPlan MoELayerImpl::plan_for(int num_tokens) const {
  return plan_for_tokens(config_, std::max(num_tokens, 1), tuned_for(num_tokens));
}

bool MoELayerImpl::fused_routing_for(int num_tokens) const {
  const RoutingVariant variant =
      forced_routing_.value_or(routing_variant_for(config_.routing, num_tokens));
  return variant == RoutingVariant::Fused &&
         fused_routing_fits(num_tokens, config_.routing.top_k, config_.local_experts());
}

std::string MoELayerImpl::describe(int num_tokens) const {
  return plan_for(num_tokens).to_string() + " routing=" +
         routing_variant_name(fused_routing_for(num_tokens) ? RoutingVariant::Fused
                                                            : RoutingVariant::Split);
}

void MoELayerImpl::run_stage(Stage stage, const ForwardArgs& a, cudaStream_t stream) {
  const int t = a.num_tokens, k = config_.routing.top_k;
  const int e_local = config_.local_experts();
  const int rows = t * k;
  const int32_t* ids = precomputed(a) ? a.topk_ids : topk_ids_;
  const float* weights = precomputed(a) ? a.topk_weights : topk_weights_;
  const LayerPlan plan = plan_for(t);
  const int tiles_cap = max_tiles(rows, e_local, plan.tile_m);
  // The fused kernel does routing and permute in the Routing stage; the
  // Permute stage then launches nothing.
  const bool fused = fused_routing_for(t);
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
  switch (stage) {
    case Stage::Routing: {
      if (fused) {
        launch_fused_routing_permute(routing_params(), permute_params(), stream);
        return;
      }
      if (precomputed(a) || t == 0) return;
      launch_routing(routing_params(), stream);
      return;
    }
    case Stage::Permute: {
      if (fused) return;
      launch_permute(permute_params(), stream);
      return;
    }
    case Stage::Gemm1: {
      if (t == 0) return;
      if (plan.path == ExpertsPath::Cutlass) {
        run_cutlass_gemm1(a, plan, stream);
        return;
      }
      Gemm1Params p;
      p.x = static_cast<const uint16_t*>(a.x);
      p.permuted_to_expanded = permuted_to_expanded_;
      p.top_k = k;
      p.w13 = static_cast<const uint16_t*>(weights_.w13);
      p.b13 = weights_.b13;
      p.tiles = tiles_;
      p.num_tiles = num_tiles_;
      p.max_tiles = tiles_cap;
      p.hidden = config_.experts.hidden;
      p.intermediate = config_.experts.intermediate;
      p.activation = config_.experts.activation;
      p.swiglu_alpha = config_.experts.swiglu_alpha;
      p.swiglu_limit = config_.experts.swiglu_limit;
      p.act_out = act_;
      launch_gemm1(p, plan.gemm1, stream);
      return;
    }
    case Stage::Gemm2: {
      if (t == 0) return;
      if (plan.path == ExpertsPath::Cutlass) {
        run_sm90_gemm(act_, weights_.w2, y_, config_.experts.hidden, config_.experts.intermediate,
                      plan, stream);
        return;
      }
      Gemm2Params p;
      p.act = act_;
      p.w2 = static_cast<const uint16_t*>(weights_.w2);
      p.b2 = weights_.b2;
      p.tiles = tiles_;
      p.num_tiles = num_tiles_;
      p.max_tiles = tiles_cap;
      p.hidden = config_.experts.hidden;
      p.intermediate = config_.experts.intermediate;
      p.y = y_;
      launch_gemm2(p, plan.gemm2, stream);
      return;
    }
    case Stage::Finalize: {
      if (t == 0) return;
      FinalizeParams p;
      p.y = y_;
      p.expanded_to_permuted = expanded_to_permuted_;
      p.topk_weights = weights;
      p.num_tokens = t;
      p.top_k = k;
      p.hidden = config_.experts.hidden;
      p.out = static_cast<uint16_t*>(a.out);
      if (plan.path == ExpertsPath::Cutlass && weights_.b2) {
        p.b2 = weights_.b2;
        p.topk_ids = ids;
        p.local_offset = config_.experts.local_expert_offset;
      }
      launch_finalize(p, stream);
      return;
    }
  }
}

void MoELayerImpl::run_sm90_gemm(const uint16_t* a, const void* b, uint16_t* d, int n, int k,
                                 const LayerPlan& plan, cudaStream_t stream) {
  Sm90GroupedGemmParams p;
  p.a = a;
  p.expert_offsets = expert_offsets_;
  p.b = static_cast<const uint16_t*>(b);
  p.d = d;
  p.num_groups = config_.local_experts();
  p.n = n;
  p.k = k;
  p.workspace = sm90_workspace_;
  p.sm_count = sm_count_;
  p.tactic = plan.sm90;
  launch_sm90_grouped_gemm(p, stream);
}

void MoELayerImpl::run_cutlass_gemm1(const ForwardArgs& a, const LayerPlan& plan,
                                     cudaStream_t stream) {
  if (!cutlass_arena_)
    throw std::runtime_error("the Cutlass path's buffers were not allocated for this layer");
  const int capacity = a.num_tokens * config_.routing.top_k;
  GatherRowsParams g;
  g.x = static_cast<const uint16_t*>(a.x);
  g.permuted_to_expanded = permuted_to_expanded_;
  g.expert_offsets = expert_offsets_;
  g.num_groups = config_.local_experts();
  g.top_k = config_.routing.top_k;
  g.hidden = config_.experts.hidden;
  g.capacity = capacity;
  g.out = gathered_;
  launch_gather_rows(g, stream);
  run_sm90_gemm(gathered_, weights_.w13, h_, config_.gemm1_cols(), config_.experts.hidden, plan,
                stream);
  GatedActivationParams act;
  act.h = h_;
  act.b13 = weights_.b13;
  act.expert_offsets = expert_offsets_;
  act.num_groups = config_.local_experts();
  act.capacity = capacity;
  act.intermediate = config_.experts.intermediate;
  act.activation = config_.experts.activation;
  act.swiglu_alpha = config_.experts.swiglu_alpha;
  act.swiglu_limit = config_.experts.swiglu_limit;
  act.out = act_;
  launch_gated_activation(act, stream);
}

void MoELayerImpl::forward(const ForwardArgs& args, CUstream_st* stream) {
  check_args(args);
  for (Stage s : kStages) run_stage(s, args, stream);
}

std::unique_ptr<MoELayer> MoELayer::create(const MoEConfig& config, int max_tokens) {
  return std::make_unique<MoELayerImpl>(config, max_tokens);
}

}  // namespace unimoe
