// A layer on synthetic weights that the host can regenerate, with input
// buffers and an error check against the CPU reference: the fixture of the
// layer and tuning GPU tests.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "kernels/common/fill.cuh"
#include "dev/overrides.h"
#include "layer/layer_access.h"
#include "layer/moe_layer.h"
#include "ref/ref.h"
#include "ref/synthetic.h"
#include "support/device_weights.h"
#include "support/reference_check.h"

namespace unimoe::test {

// Relative L2 error bound of the layer's output. Operands are bf16 with fp32
// accumulation; the activated intermediate and y are rounded to bf16 on the
// device (the reference rounds the intermediate only) and out is rounded to
// bf16: expected errors are a few 1e-3.
inline constexpr double kLayerTolerance = 1e-2;

// The field of the unimoe::Error that `f` throws, or "no error".
inline std::string field_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.field();
  }
  return "no error";
}

// Logits that send every token to `hot` first (then K-1 others at random).
inline std::vector<float> hot_expert_logits(const MoEConfig& c, int t, uint64_t seed, int hot) {
  std::vector<float> l = ref::make_logits(c, t, seed, "uniform");
  for (int r = 0; r < t; ++r) l[std::size_t(r) * c.routing.num_experts + hot] += 100.0f;
  return l;
}

// Logits under which only experts [0, live) are ever chosen.
inline std::vector<float> few_experts_logits(const MoEConfig& c, int t, uint64_t seed, int live) {
  std::vector<float> l = ref::make_logits(c, t, seed, "uniform");
  for (int r = 0; r < t; ++r)
    for (int e = live; e < c.routing.num_experts; ++e) l[std::size_t(r) * c.routing.num_experts + e] -= 50.0f;
  return l;
}

// Precomputed routing of T tokens: `ids` (T * K of them, as given) with
// every weight w.
inline ref::Routing given_routing(int t, int k, std::vector<int32_t> ids, float w) {
  ref::Routing r;
  r.num_tokens = t;
  r.top_k = k;
  r.ids = std::move(ids);
  r.ids.resize(std::size_t(t) * k);
  r.weights.assign(r.ids.size(), w);
  return r;
}

// One token of K = 8 whose ids repeat expert 5 (E >= 256): a two-row tile.
inline ref::Routing repeated_expert_routing() {
  return given_routing(1, 8, {5, 77, 5, 130, 201, 9, 64, 255}, 1.0f / 8);
}

// The FP8 forms the layer tests run: the variant and whether
// FP8PerTensor's activation scales are static (given with the weights,
// LayerRig's static_scales) or computed per call.
struct Fp8Form {
  QuantVariant quant;
  bool static_scales;
  const char* name;
};
inline constexpr Fp8Form kFp8Forms[] = {{QuantVariant::FP8Block128, false, "block128"},
                                        {QuantVariant::FP8PerTensor, false, "per-tensor dynamic"},
                                        {QuantVariant::FP8PerTensor, true, "per-tensor static"}};

// A layer with synthetic weights that the host can regenerate
// (support/device_weights.h: bf16, or FP8 codes and scales, for the config's
// variant). static_scales: FP8PerTensor's static activation scales, which
// the reference then uses too. dev: development overrides for the layer
// (a forced kernel form), else the defaults. scratch: a caller's scratch
// for the layer's per-call buffers (MoELayer::create with a scratch; with
// the environment's overrides, not `dev`).
class LayerRig {
 public:
  LayerRig(const MoEConfig& c, int max_tokens, uint64_t seed, bool static_scales = false,
           const DevOverrides* dev = nullptr, const ScratchBuffer* scratch = nullptr)
      : c_(c), seeds_(ref::seeds_for(seed)), host_weights_(c, seeds_),
        weights_(c, seeds_, nullptr, static_scales) {
    const std::size_t h = c.experts.hidden;
    bias_host_ = ref::host_bias(c, seeds_);
    bias_ = DeviceBuffer<float>(bias_host_);
    layer_ = scratch != nullptr ? MoELayer::create(c, max_tokens, scratch->ptr, scratch->bytes)
             : dev != nullptr   ? layer_access::create(c, max_tokens, *dev)
                                : MoELayer::create(c, max_tokens);
    layer_->set_weights(weights_.weights());
    x_ = DeviceBuffer<uint16_t>(std::size_t(max_tokens) * h);
    logits_ = DeviceBuffer<float>(std::size_t(max_tokens) * c.routing.num_experts);
    out_ = DeviceBuffer<uint16_t>(std::size_t(max_tokens) * h);
  }

  // Args for T tokens over this rig's buffers.
  ForwardArgs args(int t) const {
    ForwardArgs a;
    a.num_tokens = t;
    a.x = x_.get();
    a.logits = logits_.get();
    a.routing_bias = c_.routing.has_bias ? bias_.get() : nullptr;
    a.out = out_.get();
    return a;
  }

  // New x (from `x_seed`) and the given logits into the input buffers; out poisoned.
  void load_inputs(int t, uint64_t x_seed, const std::vector<float>& logits) {
    seeds_.x = x_seed;
    launch_fill_bf16(x_.get(), std::size_t(t) * c_.experts.hidden, x_seed, ref::kXScale, nullptr);
    UNIMOE_CUDA_CHECK(cudaMemcpy(logits_.get(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    out_.poison();
    // The fill and the memset run on the legacy stream; a graph replayed on a
    // non-blocking stream does not wait for them.
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // The reference output for T tokens of the loaded x and the routing the
  // reference computes from `logits` (or the given routing).
  std::vector<float> reference(int t, const std::vector<float>& logits,
                               const ref::Routing* given = nullptr) {
    const ref::Routing routing =
        given ? *given
              : ref::route(c_.routing, logits.data(), t, c_.routing.has_bias ? bias_host_.data() : nullptr);
    const std::vector<float> x = ref::host_x(c_, t, seeds_);
    // The allowance for the path this rig's layer takes at T (wider on the
    // FP8 wgmma paths: support/reference_check.h).
    const double precision = bench::gemm1_sum_precision(impl().plan_for(t, given != nullptr));
    std::vector<float> out = ref::moe_forward(c_, host_weights_.source(), x.data(), routing, 0,
                                              weights_.static_scales(), &flip_allowance_, precision);
    flip_allowance_ = ref::relative_flip_allowance(flip_allowance_, out);
    return out;
  }

  // Of the last reference(): the output's change, relative to its L2 norm,
  // that the intermediate's near ties may make on this rig's path
  // (ref::moe_forward's flip_allowance; FP8 variants): the error a check
  // may allow beyond its bound.
  double flip_allowance() const { return flip_allowance_; }

  // Relative L2 error of the device output against `want` (reference()).
  double error_against(int t, const std::vector<float>& want) {
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> bits = out_.download();
    std::vector<float> got(std::size_t(t) * c_.experts.hidden);
    for (std::size_t j = 0; j < got.size(); ++j) got[j] = ref::bf16_to_f32(bits[j]);
    return test::rel_l2(got, want);
  }

  // Relative L2 error of the device output against the reference.
  double error(int t, const std::vector<float>& logits, const ref::Routing* given = nullptr) {
    return error_against(t, reference(t, logits, given));
  }

  // One forward of T tokens with precomputed routing (ids and weights the
  // caller passes, the weights halved so that they are not what the logits
  // would give), and its relative L2 error against the reference on that
  // routing.
  double precomputed_routing_error(int t, uint64_t seed) {
    const std::vector<float> logits = ref::make_logits(c_, t, seed, "uniform");
    ref::Routing routing = ref::route(c_.routing, logits.data(), t, nullptr);
    for (float& w : routing.weights) w *= 0.5f;
    forward_routed(t, seed, logits, routing);
    return error(t, logits, &routing);
  }

  // One forward of routing.num_tokens tokens with `routing` given as
  // precomputed routing (its ids and weights, which may be anything the
  // layer accepts), x from `x_seed`, the logits loaded too, out poisoned
  // first. Returns once the forward is done.
  void forward_routed(int t, uint64_t x_seed, const std::vector<float>& logits,
                      const ref::Routing& routing) {
    DeviceBuffer<int32_t> ids(routing.ids);
    DeviceBuffer<float> weights(routing.weights);
    load_inputs(t, x_seed, logits);
    ForwardArgs a = args(t);
    a.logits = nullptr;
    a.topk_ids = ids.get();
    a.topk_weights = weights.get();
    layer_->forward(a, nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // The output's bf16 bits for T tokens (after the device is idle).
  std::vector<uint16_t> output_bits(int t) {
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> bits = out_.download();
    bits.resize(std::size_t(t) * c_.experts.hidden);
    return bits;
  }

  MoELayer& layer() { return *layer_; }
  // The synthetic device weights the layer was given.
  ExpertWeights device_weights() const { return weights_.weights(); }
  // The implementation, for what the public interface does not offer
  // (trying tuning candidates).
  MoELayerImpl& impl() { return static_cast<MoELayerImpl&>(*layer_); }
  const MoEConfig& config() const { return c_; }

 private:
  MoEConfig c_;
  ref::Seeds seeds_;
  ref::HostWeights host_weights_;
  SyntheticDeviceWeights weights_;
  DeviceBuffer<uint16_t> x_, out_;
  DeviceBuffer<float> bias_, logits_;
  std::vector<float> bias_host_;
  std::unique_ptr<MoELayer> layer_;
  double flip_allowance_ = 0.0;
};

// One forward captured once in a CUDA graph on its own stream; each
// replay() launches it and waits for it.
class CapturedForward {
 public:
  CapturedForward(MoELayer& layer, const ForwardArgs& args) {
    UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    graph_ = test::capture(stream_, cudaStreamCaptureModeThreadLocal, [&] {
      layer.forward(args, stream_);
    });
    UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  CapturedForward(const CapturedForward&) = delete;
  CapturedForward& operator=(const CapturedForward&) = delete;
  ~CapturedForward() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    cudaStreamDestroy(stream_);
  }
  void replay() {
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  cudaStream_t stream_{};
  cudaGraph_t graph_{};
  cudaGraphExec_t exec_{};
};

// Two layers of one config, weights and seed, made with the development
// overrides `a` and `b`, give the same output bits, and `a`'s is within
// `tolerance` (plus the reference's flip allowance) of the reference: eager
// at each T of `eager_ts` (the largest is max_tokens), then replayed from
// one graph of `graph_t` tokens with fresh routing (expert `hot` taking
// every token on the second replay).
inline void expect_same_bits(const MoEConfig& c, uint64_t seed, bool static_scales,
                             const DevOverrides& a, const DevOverrides& b,
                             std::initializer_list<int> eager_ts, int graph_t, double tolerance,
                             int hot) {
  const int max_t = std::max(eager_ts);
  LayerRig rig(c, max_t, seed, static_scales, &a);
  LayerRig twin(c, max_t, seed, static_scales, &b);
  auto same_bits = [&](int t, const std::vector<float>& logits) {
    twin.load_inputs(t, seed + t, logits);
    twin.layer().forward(twin.args(t), nullptr);
    EXPECT_EQ(rig.output_bits(t), twin.output_bits(t)) << "T=" << t;
    const std::vector<float> want = rig.reference(t, logits);
    EXPECT_LT(rig.error_against(t, want), tolerance + rig.flip_allowance()) << "T=" << t;
  };
  for (int t : eager_ts) {
    const std::vector<float> logits = ref::make_logits(c, t, seed + t, "uniform");
    rig.load_inputs(t, seed + t, logits);
    rig.layer().forward(rig.args(t), nullptr);
    same_bits(t, logits);
  }
  const int t = graph_t;
  rig.load_inputs(t, seed + t, ref::make_logits(c, t, seed, "uniform"));
  CapturedForward graph(rig.layer(), rig.args(t));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    const std::vector<float> logits = replay == 1 ? hot_expert_logits(c, t, seed + replay, hot)
                                                  : ref::make_logits(c, t, seed + replay, "uniform");
    rig.load_inputs(t, seed + t, logits);
    graph.replay();
    same_bits(t, logits);
  }
}

}  // namespace unimoe::test
