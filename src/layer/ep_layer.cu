#include "layer/ep_layer.h"

#include <cstdint>
#include <string>

#include "kernels/common/common.cuh"
#include "kernels/ep/ep_exchange.cuh"
#include "kernels/routing/routing.cuh"
#include "layer/layer_access.h"
#include "layer/workspace_carver.h"
#include "plan/routing_plan.h"

namespace unimoe {

const char* ep_step_name(EPLayer::Step step) {
  switch (step) {
    case EPLayer::Step::Dispatch: return "dispatch";
    case EPLayer::Step::Exchange: return "exchange";
    case EPLayer::Step::Experts: return "experts";
    case EPLayer::Step::Return: return "return";
    case EPLayer::Step::Combine: return "combine";
  }
  return "?";
}

namespace {

class EPLayerImpl final : public EPLayer {
 public:
  EPLayerImpl(const MoEConfig& config, int max_tokens, EPTransport& transport, const DevOverrides& dev)
      : g_(plan_ep(config, max_tokens, transport.rank(), transport.world_size())),
        transport_(transport),
        dev_(dev) {
    local_ = layer_access::create(g_.local_config, g_.local_tokens(), dev);
    RoutingConfig routing = config.routing;
    probe_routing_device_caps(routing, caps_);
    carve(nullptr);
    UNIMOE_CUDA_CHECK(cudaMalloc(&arena_, arena_bytes_));
    // Padding rows are never read as tokens, but kernels that scan whole
    // inputs (FP8's row quantization) read them: give them defined values.
    UNIMOE_CUDA_CHECK(cudaMemset(arena_, 0, arena_bytes_));
    carve(static_cast<char*>(arena_));
  }
  ~EPLayerImpl() override { cudaFree(arena_); }

  int rank() const override { return g_.rank; }
  int world_size() const override { return g_.world_size; }
  int max_tokens() const override { return g_.max_tokens; }
  MoELayer& local_layer() override { return *local_; }
  std::size_t buffer_bytes() const override { return arena_bytes_; }
  std::size_t bytes_sent_per_call() const override { return g_.bytes_sent_per_call(); }
  void set_weights(const ExpertWeights& weights) override {
    // A dynamic per-tensor scale would be the amax of every row the rank
    // receives, padding rows included, and would depend on the other ranks'
    // tokens.
    if (g_.local_config.experts.quant == QuantVariant::FP8PerTensor && (!weights.x_scale || !weights.act_scale))
      throw Error(weights.x_scale ? "weights.act_scale" : "weights.x_scale",
                  "expert parallelism needs FP8PerTensor's static activation scales (x_scale and "
                  "act_scale): dynamic ones would be taken over the rows each rank receives");
    local_->set_weights(weights);
  }

  void forward(const ForwardArgs& args, CUstream_st* stream) override {
    check_args(args);
    for (Step s : kEPSteps) launch_step(s, args, stream);
  }

  void run_step(Step step, const ForwardArgs& args, CUstream_st* stream) override {
    check_args(args);
    launch_step(step, args, stream);
  }

  const EPGeometry& geometry() const { return g_; }
  const int32_t* counts() const { return counts_; }
  const int32_t* slots() const { return slots_; }
  const int32_t* topk_ids() const { return topk_ids_; }
  const float* topk_weights() const { return topk_weights_; }

 private:
  // Every buffer, in one allocation (base nullptr: only the size).
  void carve(char* base) {
    WorkspaceCarver c(base);
    const std::size_t chunk_rows = std::size_t(g_.world_size) * g_.max_tokens;
    slots_ = c.take<int32_t>(std::size_t(g_.max_tokens) * g_.world_size);
    counts_ = c.take<int32_t>(g_.world_size);
    topk_ids_ = c.take<int32_t>(std::size_t(g_.max_tokens) * g_.top_k);
    topk_weights_ = c.take<float>(std::size_t(g_.max_tokens) * g_.top_k);
    // send_x carries the dispatch's rows out and, once they are sent, the
    // partial sums coming back.
    send_x_ = c.take<uint16_t>(chunk_rows * g_.hidden);
    send_ids_ = c.take<int32_t>(chunk_rows * g_.top_k);
    send_weights_ = c.take<float>(chunk_rows * g_.top_k);
    recv_x_ = c.take<uint16_t>(chunk_rows * g_.hidden);
    recv_ids_ = c.take<int32_t>(chunk_rows * g_.top_k);
    recv_weights_ = c.take<float>(chunk_rows * g_.top_k);
    partial_ = c.take<uint16_t>(chunk_rows * g_.hidden);
    arena_bytes_ = c.used();
  }

  void check_args(const ForwardArgs& a) const {
    if (a.num_tokens < 0 || a.num_tokens > g_.max_tokens)
      throw Error("num_tokens", "is " + std::to_string(a.num_tokens) + "; allowed: 0.." +
                                    std::to_string(g_.max_tokens) + " (the EP layer's max_tokens)");
    if (!a.x || !a.out) throw Error("args", "x and out must be set");
    if ((a.topk_ids == nullptr) != (a.topk_weights == nullptr))
      throw Error("args", "precomputed routing needs both topk_ids and topk_weights");
    if (!a.topk_ids && !a.logits) throw Error("args", "logits must be set (or topk_ids and topk_weights)");
    if (!a.topk_ids && g_.local_config.routing.has_bias && !a.routing_bias)
      throw Error("routing_bias", "the config has a routing bias (has_bias): pass it");
    if ((reinterpret_cast<std::uintptr_t>(a.x) | reinterpret_cast<std::uintptr_t>(a.out)) % 16 != 0)
      throw Error("args", "x and out must be 16-byte aligned");
  }

  void launch_step(Step step, const ForwardArgs& a, cudaStream_t stream) {
    const int cap = g_.max_tokens, w = g_.world_size, k = g_.top_k;
    switch (step) {
      case Step::Dispatch: {
        const int32_t* ids = a.topk_ids;
        const float* weights = a.topk_weights;
        if (!ids) {
          route(a, stream);
          ids = topk_ids_;
          weights = topk_weights_;
        }
        EPDispatchParams p;
        p.x = static_cast<const uint16_t*>(a.x);
        p.topk_ids = ids;
        p.topk_weights = weights;
        p.num_tokens = a.num_tokens;
        p.top_k = k;
        p.hidden = g_.hidden;
        p.num_experts = g_.num_experts;
        p.experts_per_rank = g_.experts_per_rank;
        p.world_size = w;
        p.max_tokens = cap;
        p.slots = slots_;
        p.counts = counts_;
        p.send_x = send_x_;
        p.send_ids = send_ids_;
        p.send_weights = send_weights_;
        launch_ep_dispatch(p, stream);
        return;
      }
      case Step::Exchange: {
        const EPTransport::Array arrays[] = {{send_x_, recv_x_, g_.x_chunk_bytes()},
                                             {send_ids_, recv_ids_, g_.ids_chunk_bytes()},
                                             {send_weights_, recv_weights_, g_.weights_chunk_bytes()}};
        transport_.all_to_all(arrays, 3, stream);
        return;
      }
      case Step::Experts: {
        ForwardArgs l;
        l.num_tokens = g_.local_tokens();
        l.x = recv_x_;
        l.topk_ids = recv_ids_;
        l.topk_weights = recv_weights_;
        l.out = partial_;
        local_->forward(l, stream);
        return;
      }
      case Step::Return: {
        const EPTransport::Array back = {partial_, send_x_, g_.x_chunk_bytes()};
        transport_.all_to_all(&back, 1, stream);
        return;
      }
      case Step::Combine: {
        EPCombineParams p;
        p.partials = send_x_;
        p.slots = slots_;
        p.num_tokens = a.num_tokens;
        p.hidden = g_.hidden;
        p.world_size = w;
        p.max_tokens = cap;
        p.out = static_cast<uint16_t*>(a.out);
        launch_ep_combine(p, stream);
        return;
      }
    }
  }

  // This rank's tokens routed by the split chain's routing kernel (the
  // fused kinds permute too, which dispatch does instead).
  void route(const ForwardArgs& a, cudaStream_t stream) {
    MoEConfig c = g_.local_config;
    c.options.routing_variant = "split";
    RoutingPlan plan = plan_routing(c, a.num_tokens, false, caps_, dev_);
    plan.routing_counts_rows = false;  // no permute follows: no chunk counts
    if (plan.kernel == RoutingKernel::None) return;
    RoutingParams p;
    p.logits = a.logits;
    p.bias = a.routing_bias;
    p.num_tokens = a.num_tokens;
    p.config = c.routing;
    p.topk_ids = topk_ids_;
    p.topk_weights = topk_weights_;
    launch_routing(p, plan, KernelStream(stream, false));
  }

  EPGeometry g_;
  EPTransport& transport_;
  DevOverrides dev_;
  RoutingDeviceCaps caps_;
  std::unique_ptr<MoELayer> local_;
  void* arena_ = nullptr;
  std::size_t arena_bytes_ = 0;
  int32_t* slots_ = nullptr;
  int32_t* counts_ = nullptr;
  int32_t* topk_ids_ = nullptr;
  float* topk_weights_ = nullptr;
  uint16_t* send_x_ = nullptr;
  int32_t* send_ids_ = nullptr;
  float* send_weights_ = nullptr;
  uint16_t* recv_x_ = nullptr;
  int32_t* recv_ids_ = nullptr;
  float* recv_weights_ = nullptr;
  uint16_t* partial_ = nullptr;
};

const EPLayerImpl& impl(const EPLayer& layer) { return static_cast<const EPLayerImpl&>(layer); }

}  // namespace

std::unique_ptr<EPLayer> EPLayer::create(const MoEConfig& config, int max_tokens, EPTransport& transport) {
  return std::make_unique<EPLayerImpl>(config, max_tokens, transport, DevOverrides::from_environment());
}

namespace ep_access {

std::unique_ptr<EPLayer> create(const MoEConfig& config, int max_tokens, EPTransport& transport,
                                const DevOverrides& dev) {
  return std::make_unique<EPLayerImpl>(config, max_tokens, transport, dev);
}
const EPGeometry& geometry(const EPLayer& layer) { return impl(layer).geometry(); }
const int32_t* dispatch_counts(const EPLayer& layer) { return impl(layer).counts(); }
const int32_t* dispatch_slots(const EPLayer& layer) { return impl(layer).slots(); }
const int32_t* routed_ids(const EPLayer& layer) { return impl(layer).topk_ids(); }
const float* routed_weights(const EPLayer& layer) { return impl(layer).topk_weights(); }

}  // namespace ep_access

}  // namespace unimoe
