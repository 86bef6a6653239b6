#include "layer/ep_layer.h"

#include <cstdint>
#include <string>

#include "kernels/common/common.cuh"
#include "kernels/ep/ep_exchange.cuh"
#include "kernels/routing/routing.cuh"
#include "layer/layer_access.h"
#include "layer/moe_layer.h"
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

// The EP buffers of one rank, in one allocation or in the caller's scratch.
struct EPBuffers {
  int32_t* slots = nullptr;
  int32_t* counts = nullptr;
  int32_t* topk_ids = nullptr;
  float* topk_weights = nullptr;
  // send_x carries the dispatch's rows out and, once they are sent, the
  // partial sums coming back.
  uint16_t* send_x = nullptr;
  int32_t* send_ids = nullptr;
  float* send_weights = nullptr;
  uint16_t* recv_x = nullptr;
  int32_t* recv_ids = nullptr;
  float* recv_weights = nullptr;
  uint16_t* partial = nullptr;
};

// Places every buffer from `base` (nullptr: only the size); returns the
// bytes they take, a multiple of WorkspaceCarver::kAlign.
std::size_t carve_buffers(const EPGeometry& g, char* base, EPBuffers& b) {
  WorkspaceCarver c(base);
  const std::size_t chunk_rows = std::size_t(g.world_size) * g.max_tokens;
  b.slots = c.take<int32_t>(std::size_t(g.max_tokens) * g.world_size);
  b.counts = c.take<int32_t>(g.world_size);
  b.topk_ids = c.take<int32_t>(std::size_t(g.max_tokens) * g.top_k);
  b.topk_weights = c.take<float>(std::size_t(g.max_tokens) * g.top_k);
  b.send_x = c.take<uint16_t>(chunk_rows * g.hidden);
  b.send_ids = c.take<int32_t>(chunk_rows * g.top_k);
  b.send_weights = c.take<float>(chunk_rows * g.top_k);
  b.recv_x = c.take<uint16_t>(chunk_rows * g.hidden);
  b.recv_ids = c.take<int32_t>(chunk_rows * g.top_k);
  b.recv_weights = c.take<float>(chunk_rows * g.top_k);
  b.partial = c.take<uint16_t>(chunk_rows * g.hidden);
  return c.used();  // each slice is rounded up to kAlign
}

class EPLayerImpl final : public EPLayer {
 public:
  // `scratch`: the caller's buffer for the EP buffers and the local layer's
  // per-call buffers (EPLayer::create with a scratch), or null for
  // allocations of the layer's own.
  EPLayerImpl(const MoEConfig& config, int max_tokens, EPTransport& transport, const DevOverrides& dev,
              const ScratchBuffer* scratch = nullptr)
      : g_(plan_ep(config, max_tokens, transport.rank(), transport.world_size())),
        transport_(transport),
        dev_(dev) {
    RoutingConfig routing = config.routing;
    probe_routing_device_caps(routing, caps_);
    arena_bytes_ = carve_buffers(g_, nullptr, b_);
    char* base = nullptr;
    if (scratch) {
      check_scratch(*scratch, scratch_need(g_), g_.max_tokens, "EPLayer::scratch_bytes");
      base = static_cast<char*>(scratch->ptr);
      // The local layer's per-call buffers follow the EP buffers.
      const ScratchBuffer local{base + arena_bytes_, scratch->bytes - arena_bytes_};
      local_ = std::make_unique<MoELayerImpl>(g_.local_config, g_.local_tokens(), dev, &local);
    } else {
      local_ = layer_access::create(g_.local_config, g_.local_tokens(), dev);
      UNIMOE_CUDA_CHECK(cudaMalloc(&arena_, arena_bytes_));
      base = static_cast<char*>(arena_);
    }
    // Padding rows are never read as tokens, but kernels that scan whole
    // inputs (FP8's row quantization) read them: give them defined values.
    // (In a shared scratch, later layers' calls leave their bytes there;
    // those kernels treat each row alone, so no token's result depends on
    // them.) The memset runs on the legacy stream, which a forward on a
    // non-blocking stream does not wait for: done before create returns.
    UNIMOE_CUDA_CHECK(cudaMemset(base, 0, arena_bytes_));
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    carve_buffers(g_, base, b_);
  }
  ~EPLayerImpl() override { cudaFree(arena_); }

  // EPLayer::scratch_bytes for a rank of this geometry: the EP buffers,
  // then the local layer's per-call buffers.
  static std::size_t scratch_need(const EPGeometry& g) {
    EPBuffers sizes;
    return carve_buffers(g, nullptr, sizes) +
           MoELayerImpl::scratch_bytes(g.local_config, g.local_tokens());
  }

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
  const int32_t* counts() const { return b_.counts; }
  const int32_t* slots() const { return b_.slots; }
  const int32_t* topk_ids() const { return b_.topk_ids; }
  const float* topk_weights() const { return b_.topk_weights; }

 private:

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
          ids = b_.topk_ids;
          weights = b_.topk_weights;
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
        p.slots = b_.slots;
        p.counts = b_.counts;
        p.send_x = b_.send_x;
        p.send_ids = b_.send_ids;
        p.send_weights = b_.send_weights;
        launch_ep_dispatch(p, stream);
        return;
      }
      case Step::Exchange: {
        const EPTransport::Array arrays[] = {{b_.send_x, b_.recv_x, g_.x_chunk_bytes()},
                                             {b_.send_ids, b_.recv_ids, g_.ids_chunk_bytes()},
                                             {b_.send_weights, b_.recv_weights, g_.weights_chunk_bytes()}};
        transport_.all_to_all(arrays, 3, stream);
        return;
      }
      case Step::Experts: {
        ForwardArgs l;
        l.num_tokens = g_.local_tokens();
        l.x = b_.recv_x;
        l.topk_ids = b_.recv_ids;
        l.topk_weights = b_.recv_weights;
        l.out = b_.partial;
        local_->forward(l, stream);
        return;
      }
      case Step::Return: {
        const EPTransport::Array back = {b_.partial, b_.send_x, g_.x_chunk_bytes()};
        transport_.all_to_all(&back, 1, stream);
        return;
      }
      case Step::Combine: {
        EPCombineParams p;
        p.partials = b_.send_x;
        p.slots = b_.slots;
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
    p.topk_ids = b_.topk_ids;
    p.topk_weights = b_.topk_weights;
    launch_routing(p, plan, KernelStream(stream, false));
  }

  EPGeometry g_;
  EPTransport& transport_;
  DevOverrides dev_;
  RoutingDeviceCaps caps_;
  std::unique_ptr<MoELayer> local_;
  void* arena_ = nullptr;        // the EP buffers' allocation, where no scratch was given
  std::size_t arena_bytes_ = 0;  // the EP buffers' bytes
  EPBuffers b_;
};

const EPLayerImpl& impl(const EPLayer& layer) { return static_cast<const EPLayerImpl&>(layer); }

}  // namespace

std::unique_ptr<EPLayer> EPLayer::create(const MoEConfig& config, int max_tokens, EPTransport& transport) {
  return std::make_unique<EPLayerImpl>(config, max_tokens, transport, DevOverrides::from_environment());
}

std::size_t EPLayer::scratch_bytes(const MoEConfig& config, int max_tokens, int world_size) {
  if (world_size < 1 || world_size > kMaxWorldSize)
    throw Error("world_size", "is " + std::to_string(world_size) + "; allowed: 1.." +
                                  std::to_string(kMaxWorldSize));
  // Every rank's buffers have rank 0's sizes.
  return EPLayerImpl::scratch_need(plan_ep(config, max_tokens, 0, world_size));
}

std::unique_ptr<EPLayer> EPLayer::create(const MoEConfig& config, int max_tokens, EPTransport& transport,
                                         void* scratch, std::size_t scratch_size) {
  const ScratchBuffer buffer{scratch, scratch_size};
  return std::make_unique<EPLayerImpl>(config, max_tokens, transport, DevOverrides::from_environment(),
                                       &buffer);
}

namespace ep_access {

std::unique_ptr<EPLayer> create(const MoEConfig& config, int max_tokens, EPTransport& transport,
                                const DevOverrides& dev) {
  return std::make_unique<EPLayerImpl>(config, max_tokens, transport, dev);
}
std::unique_ptr<EPLayer> create(const MoEConfig& config, int max_tokens, EPTransport& transport,
                                const DevOverrides& dev, void* scratch, std::size_t scratch_size) {
  const ScratchBuffer buffer{scratch, scratch_size};
  return std::make_unique<EPLayerImpl>(config, max_tokens, transport, dev, &buffer);
}
const EPGeometry& geometry(const EPLayer& layer) { return impl(layer).geometry(); }
const int32_t* dispatch_counts(const EPLayer& layer) { return impl(layer).counts(); }
const int32_t* dispatch_slots(const EPLayer& layer) { return impl(layer).slots(); }
const int32_t* routed_ids(const EPLayer& layer) { return impl(layer).topk_ids(); }
const float* routed_weights(const EPLayer& layer) { return impl(layer).topk_weights(); }

}  // namespace ep_access

}  // namespace unimoe
