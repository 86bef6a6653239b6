// A layer whose inputs a test may spoil, and the check of an output that may
// hold NaN or inf: the fixture of tests/gpu/test_hostile_inputs_gpu.cu.
// As LayerRig (gpu/layer_rig.h), with the weights generated on the device
// and regenerated on the host; in addition logits go up as the config's
// logits type, precomputed routing goes up as given, and a NaN can be
// written into x or one expert's weights on the device and in the host
// copies that the reference reads.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "kernels/common/fill.cuh"
#include "plan/autotune.h"
#include "ref/ref.h"
#include "ref/synthetic.h"
#include "unimoe/unimoe.h"

namespace unimoe::test {

inline constexpr uint16_t kBf16NaN = 0x7fc0;

// Token by token: where the reference is NaN or inf the output must be
// non-finite, where it is finite the output must be finite; a token's finite
// elements within `tolerance` relative L2 error (a row whose reference is
// all zero must be exactly zero).
inline ::testing::AssertionResult matches_reference(const std::vector<uint16_t>& got_bits,
                                                    const std::vector<float>& want, int hidden,
                                                    double tolerance) {
  if (got_bits.size() < want.size()) return ::testing::AssertionFailure() << "output too short";
  const std::size_t tokens = want.size() / hidden;
  for (std::size_t t = 0; t < tokens; ++t) {
    std::vector<uint16_t> got_row;
    std::vector<float> want_row;
    for (int h = 0; h < hidden; ++h) {
      const std::size_t i = t * hidden + h;
      const float got = ref::bf16_to_f32(got_bits[i]);
      if (std::isfinite(got) != std::isfinite(want[i]))
        return ::testing::AssertionFailure() << "token " << t << " column " << h << ": got " << got
                                             << ", reference " << want[i];
      if (!std::isfinite(want[i])) continue;
      got_row.push_back(got_bits[i]);
      want_row.push_back(want[i]);
    }
    const double err = relative_l2_error(got_row, want_row);
    if (!(err < tolerance))
      return ::testing::AssertionFailure() << "token " << t << ": relative L2 error " << err;
  }
  return ::testing::AssertionSuccess();
}

class HostileLayerRig {
 public:
  HostileLayerRig(const MoEConfig& c, int max_tokens, uint64_t seed)
      : c_(c), seeds_(ref::seeds_for(seed)), host_weights_(c, seeds_) {
    const std::size_t e = c.local_experts(), h = c.experts.hidden, i = c.experts.intermediate;
    const std::size_t n1 = c.gemm1_cols(), rows = std::size_t(max_tokens) * c.routing.top_k;
    w13_ = DeviceBuffer<uint16_t>(e * n1 * h);
    w2_ = DeviceBuffer<uint16_t>(e * h * i);
    launch_fill_bf16(w13_.get(), w13_.size(), seeds_.w13, ref::w13_scale(c), nullptr);
    launch_fill_bf16(w2_.get(), w2_.size(), seeds_.w2, ref::w2_scale(c), nullptr);
    weights_ = {w13_.get(), w2_.get(), nullptr, nullptr};
    if (c.experts.has_bias) {
      b13_ = DeviceBuffer<float>(e * n1);
      b2_ = DeviceBuffer<float>(e * h);
      launch_fill_f32(b13_.get(), b13_.size(), seeds_.b13, ref::kBiasScale, nullptr);
      launch_fill_f32(b2_.get(), b2_.size(), seeds_.b2, ref::kBiasScale, nullptr);
      weights_.b13 = b13_.get();
      weights_.b2 = b2_.get();
    }
    bias_host_ = ref::host_bias(c, seeds_);
    bias_ = DeviceBuffer<float>(bias_host_);
    x_ = DeviceBuffer<uint16_t>(std::size_t(max_tokens) * h);
    logits_ = DeviceBuffer<uint8_t>(std::size_t(max_tokens) * c.routing.num_experts * sizeof(float));
    ids_ = DeviceBuffer<int32_t>(rows);
    topk_weights_ = DeviceBuffer<float>(rows);
    out_ = DeviceBuffer<uint16_t>(std::size_t(max_tokens) * h);
    layer_ = MoELayer::create(c, max_tokens);
    layer_->set_weights(weights_);
  }

  // x for T tokens from `x_seed`, on the device and on the host.
  void load_x(int t, uint64_t x_seed) {
    seeds_.x = x_seed;
    launch_fill_bf16(x_.get(), std::size_t(t) * c_.experts.hidden, x_seed, ref::kXScale, nullptr);
    x_host_ = ref::host_x(c_, t, seeds_);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // Logits [T, E] as the config's logits type; returns the values the device
  // reads (bf16: rounded), which the reference routes on.
  std::vector<float> load_logits(const std::vector<float>& logits) {
    const ref::DeviceLogits d = ref::device_logits(logits, c_.routing.logits_type);
    UNIMOE_CUDA_CHECK(cudaMemcpy(logits_.get(), d.bytes.data(), d.bytes.size(), cudaMemcpyHostToDevice));
    return d.values;
  }

  // Precomputed ids and weights [T, K].
  void load_routing(const ref::Routing& r) {
    ids_.upload(r.ids);
    topk_weights_.upload(r.weights);
  }

  // A NaN at x[token, column], on the device and in the host copy.
  void spoil_x(int token, int column) {
    const std::size_t i = std::size_t(token) * c_.experts.hidden + column;
    UNIMOE_CUDA_CHECK(cudaMemcpy(x_.get() + i, &kBf16NaN, 2, cudaMemcpyHostToDevice));
    x_host_.at(i) = NAN;
  }

  // A NaN at w13[expert][row, column] (row < gemm1_cols, column < H) or
  // w2[expert][row, column] (row < H, column < I) of a local expert.
  void spoil_w13(int expert, int row, int column) {
    spoil(w13_, spoiled(expert).w13, expert, std::size_t(c_.gemm1_cols()) * c_.experts.hidden,
          std::size_t(row) * c_.experts.hidden + column);
  }
  void spoil_w2(int expert, int row, int column) {
    spoil(w2_, spoiled(expert).w2, expert, std::size_t(c_.experts.hidden) * c_.experts.intermediate,
          std::size_t(row) * c_.experts.intermediate + column);
  }

  // Args for T tokens: the logits, or with `precomputed` the loaded routing.
  ForwardArgs args(int t, bool precomputed = false) const {
    ForwardArgs a;
    a.num_tokens = t;
    a.x = x_.get();
    a.logits = precomputed ? nullptr : logits_.get();
    a.routing_bias = c_.routing.has_bias && !precomputed ? bias_.get() : nullptr;
    a.topk_ids = precomputed ? ids_.get() : nullptr;
    a.topk_weights = precomputed ? topk_weights_.get() : nullptr;
    a.out = out_.get();
    return a;
  }

  // Fills the output with `byte` and waits (a graph replayed on a
  // non-blocking stream does not wait for the memset).
  void poison_output(int byte) {
    out_.poison(byte);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // The reference routing of T tokens of `logits` (the values the device read).
  ref::Routing route(int t, const std::vector<float>& logits) const {
    return ref::route(c_.routing, logits.data(), t, c_.routing.has_bias ? bias_host_.data() : nullptr);
  }

  // The reference output of the loaded x under `routing`, spoiled values included.
  std::vector<float> reference(const ref::Routing& routing) {
    const ref::WeightSource source = [this](int e) {
      ref::ExpertView v = host_weights_.view(e);
      const auto it = spoiled_.find(e);
      if (it != spoiled_.end()) {
        v.w13 = it->second.w13.data();
        v.w2 = it->second.w2.data();
      }
      return v;
    };
    return ref::moe_forward(c_, source, x_host_.data(), routing);
  }

  // The output rows of T tokens, as bf16 bits.
  std::vector<uint16_t> output(int t) const {
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> bits = out_.download();
    bits.resize(std::size_t(t) * c_.experts.hidden);
    return bits;
  }

  MoELayer& layer() { return *layer_; }
  const MoEConfig& config() const { return c_; }

 private:
  struct Copy {
    std::vector<float> w13, w2;
  };

  // The host copy of a local expert's weights, made on first use.
  Copy& spoiled(int expert) {
    auto it = spoiled_.find(expert);
    if (it == spoiled_.end()) {
      const ref::ExpertView v = host_weights_.view(expert);
      const std::size_t n13 = std::size_t(c_.gemm1_cols()) * c_.experts.hidden;
      const std::size_t n2 = std::size_t(c_.experts.hidden) * c_.experts.intermediate;
      it = spoiled_.emplace(expert, Copy{{v.w13, v.w13 + n13}, {v.w2, v.w2 + n2}}).first;
    }
    return it->second;
  }

  // A bf16 NaN at element i of the expert's matrix (`per_expert` elements an
  // expert) on the device and in its host copy; the layer is given its
  // weights again, as after any change.
  void spoil(DeviceBuffer<uint16_t>& device, std::vector<float>& host, int expert,
             std::size_t per_expert, std::size_t i) {
    UNIMOE_CUDA_CHECK(cudaMemcpy(device.get() + expert * per_expert + i, &kBf16NaN, 2,
                                 cudaMemcpyHostToDevice));
    host.at(i) = NAN;
    layer_->set_weights(weights_);
  }

  MoEConfig c_;
  ref::Seeds seeds_;
  ref::HostWeights host_weights_;
  std::map<int, Copy> spoiled_;
  ExpertWeights weights_{};
  DeviceBuffer<uint16_t> w13_, w2_, x_, out_;
  DeviceBuffer<float> b13_, b2_, bias_, topk_weights_;
  DeviceBuffer<uint8_t> logits_;
  DeviceBuffer<int32_t> ids_;
  std::vector<float> bias_host_, x_host_;
  std::unique_ptr<MoELayer> layer_;
};

}  // namespace unimoe::test
