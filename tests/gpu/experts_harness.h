// A harness for the experts stages on the device: a test case, its random
// inputs (bf16 values kept as floats for host checks), and the stages
// (GEMM1, GEMM2, finalize) run on buffers sized from (T, K, E_local) alone,
// so that one set of launches serves any routing, as in a captured graph.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "kernels/gemm/grouped_gemm.cuh"
#include "ref/ref.h"

namespace unimoe::test {

struct Case {
  int tokens = 1, hidden = 64, intermediate = 64, experts = 8, top_k = 2;
  int local_offset = 0, num_local = -1;  // -1: all experts on this rank
  Activation activation = Activation::SwiGLU;
  bool bias = false;
  float bias_scale = 0.1f;
  std::vector<int> allowed;  // experts the router picks from; empty: all
  int hot = -1;              // >= 0: every token's k = 0 goes to this expert

  int local() const { return num_local < 0 ? experts : num_local; }
  bool gated() const { return activation != Activation::ReLU2; }
  int gemm1_cols() const { return gated() ? 2 * intermediate : intermediate; }
  std::string label() const {
    return "T=" + std::to_string(tokens) + " H=" + std::to_string(hidden) +
           " I=" + std::to_string(intermediate) + " E=" + std::to_string(experts) +
           " K=" + std::to_string(top_k) + " local=" + std::to_string(local_offset) + "+" +
           std::to_string(local()) + " act=" + to_string(activation) + (bias ? " bias" : "");
  }
};

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = ref::f32_to_bf16(v[i]);
  return bits;
}

inline std::vector<float> to_float(const std::vector<uint16_t>& bits) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = ref::bf16_to_f32(bits[i]);
  return v;
}

// K distinct experts per token from the allowed ones (k = 0 the hot one, if any).
inline ref::Routing make_routing(const Case& c, std::mt19937_64& rng) {
  std::vector<int> pool = c.allowed;
  if (pool.empty()) {
    pool.resize(c.experts);
    std::iota(pool.begin(), pool.end(), 0);
  }
  if (c.hot >= 0) pool.erase(std::remove(pool.begin(), pool.end(), c.hot), pool.end());
  const int drawn = c.hot >= 0 ? c.top_k - 1 : c.top_k;
  if (static_cast<int>(pool.size()) < drawn) throw std::invalid_argument("too few experts to draw");
  ref::Routing r;
  r.num_tokens = c.tokens;
  r.top_k = c.top_k;
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (int t = 0; t < c.tokens; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    if (c.hot >= 0) r.ids.push_back(c.hot);
    r.ids.insert(r.ids.end(), pool.begin(), pool.begin() + drawn);
    for (int k = 0; k < c.top_k; ++k) r.weights.push_back(weight(rng));
  }
  return r;
}

// Inputs as bf16 bits for the device and as floats (the same values) for the host.
struct Problem {
  Case c;
  std::vector<float> x, w13, w2, b13, b2;  // bf16 values; biases fp32
  ref::Routing routing;
};

inline Problem make_problem(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto bf16_values = [&](size_t n, float scale) {
    std::vector<float> v = test::random_vector(n, rng, -scale, scale);
    for (float& f : v) f = ref::round_bf16(f);
    return v;
  };
  Problem p;
  p.c = c;
  p.x = bf16_values(static_cast<size_t>(c.tokens) * c.hidden, 1.0f);
  p.w13 = bf16_values(static_cast<size_t>(c.local()) * c.gemm1_cols() * c.hidden,
                      1.0f / std::sqrt(static_cast<float>(c.hidden)));
  p.w2 = bf16_values(static_cast<size_t>(c.local()) * c.hidden * c.intermediate,
                     1.0f / std::sqrt(static_cast<float>(c.intermediate)));
  if (c.bias) {
    p.b13 = test::random_vector(static_cast<size_t>(c.local()) * c.gemm1_cols(), rng,
                                -c.bias_scale, c.bias_scale);
    p.b2 = test::random_vector(static_cast<size_t>(c.local()) * c.hidden, rng, -c.bias_scale,
                               c.bias_scale);
  }
  p.routing = make_routing(c, rng);
  return p;
}

// One tile schedule on the device, at the capacity the host would size.
struct Schedule {
  int capacity = 0;
  DeviceBuffer<DeviceTile> tiles;
  DeviceBuffer<int32_t> count{1};
};

// The three stages on the device; outputs are poisoned by set_routing.
class DeviceExperts {
 public:
  DeviceExperts(const Problem& p, const GemmTactic& t1, const GemmTactic& t2)
      : c_(p.c), t1_(t1), t2_(t2), rows_cap_(std::max(1, c_.tokens * c_.top_k)),
        x_(p.x.size()), w13_(p.w13.size()), w2_(p.w2.size()), b13_(p.b13.size()),
        b2_(p.b2.size()), p2e_(rows_cap_), e2p_(rows_cap_), weights_(rows_cap_),
        act_(static_cast<size_t>(rows_cap_) * c_.intermediate),
        y_(static_cast<size_t>(rows_cap_) * c_.hidden),
        out_(static_cast<size_t>(c_.tokens) * c_.hidden) {
    s1_.capacity = max_tiles(c_.tokens * c_.top_k, c_.local(), t1.tile_m);
    s2_.capacity = max_tiles(c_.tokens * c_.top_k, c_.local(), t2.tile_m);
    s1_.tiles = DeviceBuffer<DeviceTile>(s1_.capacity);
    s2_.tiles = DeviceBuffer<DeviceTile>(s2_.capacity);
    upload(x_, to_bf16(p.x));
    upload(w13_, to_bf16(p.w13));
    upload(w2_, to_bf16(p.w2));
    upload(b13_, p.b13);
    upload(b2_, p.b2);
  }

  // Uploads a routing's permutation and schedules, and poisons every output.
  ref::Permutation set_routing(const ref::Routing& r) {
    ref::Permutation perm =
        ref::permute(r.ids.data(), c_.tokens, c_.top_k, c_.local_offset, c_.local());
    for (DeviceBuffer<int32_t>* b : {&p2e_, &e2p_}) b->poison();
    upload(p2e_, perm.permuted_to_expanded);
    upload(e2p_, perm.expanded_to_permuted);
    upload(weights_, r.weights);
    upload_schedule(s1_, perm, t1_.tile_m);
    upload_schedule(s2_, perm, t2_.tile_m);
    act_.poison();
    y_.poison();
    out_.poison();
    return perm;
  }

  void launch(cudaStream_t stream) const {
    Gemm1Params g1;
    g1.x = x_.get();
    g1.permuted_to_expanded = p2e_.get();
    g1.top_k = c_.top_k;
    g1.w13 = w13_.get();
    g1.b13 = c_.bias ? b13_.get() : nullptr;
    g1.tiles = s1_.tiles.get();
    g1.num_tiles = s1_.count.get();
    g1.max_tiles = s1_.capacity;
    g1.hidden = c_.hidden;
    g1.intermediate = c_.intermediate;
    g1.activation = c_.activation;
    g1.act_out = act_.get();
    // As the layer does (layer/experts_backends.cu): the schedules were
    // uploaded before GEMM1, so GEMM2 may read them before its wait.
    g1.trigger_dependents_early = t1_.stream && t2_.stream;
    launch_gemm1(g1, t1_, stream);

    Gemm2Params g2;
    g2.act = act_.get();
    g2.w2 = w2_.get();
    g2.b2 = c_.bias ? b2_.get() : nullptr;
    g2.tiles = s2_.tiles.get();
    g2.num_tiles = s2_.count.get();
    g2.max_tiles = s2_.capacity;
    g2.hidden = c_.hidden;
    g2.intermediate = c_.intermediate;
    g2.y = y_.get();
    g2.schedule_ready_before_wait = true;
    g2.trigger_dependents_early = t2_.stream;
    launch_gemm2(g2, t2_, stream);

    FinalizeParams f;
    f.y = y_.get();
    f.expanded_to_permuted = e2p_.get();
    f.topk_weights = weights_.get();
    f.num_tokens = c_.tokens;
    f.top_k = c_.top_k;
    f.hidden = c_.hidden;
    f.out = out_.get();
    f.routing_ready_before_wait = true;
    launch_finalize(f, stream);
  }

  std::vector<uint16_t> act() const { return act_.download(); }
  std::vector<uint16_t> y() const { return y_.download(); }
  std::vector<uint16_t> out() const { return out_.download(); }

 private:
  template <typename T>
  static void upload(DeviceBuffer<T>& buf, const std::vector<T>& host) {
    if (!host.empty()) buf.upload(host);
  }
  static void upload_schedule(Schedule& s, const ref::Permutation& perm, int tile_m) {
    std::vector<DeviceTile> tiles;
    for (const ref::Tile& t : ref::make_tiles(perm, tile_m))
      tiles.push_back(DeviceTile{t.expert, t.row_start, t.rows, 0});
    ASSERT_LE(static_cast<int>(tiles.size()), s.capacity);
    s.tiles.poison();  // entries past the count must never be read
    upload(s.tiles, tiles);
    s.count.upload({static_cast<int32_t>(tiles.size())});
  }

  Case c_;
  GemmTactic t1_, t2_;
  int rows_cap_;
  DeviceBuffer<uint16_t> x_, w13_, w2_;
  DeviceBuffer<float> b13_, b2_;
  DeviceBuffer<int32_t> p2e_, e2p_;
  DeviceBuffer<float> weights_;
  DeviceBuffer<uint16_t> act_, y_, out_;
  Schedule s1_, s2_;
};

}  // namespace unimoe::test
