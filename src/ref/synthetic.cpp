#include "ref/synthetic.h"

#include <cmath>

#include "core/hash_random.h"

namespace unimoe::ref {
namespace {

void fill_bf16(std::vector<float>& out, std::size_t offset, uint64_t seed, float scale) {
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = ref::round_bf16(hash_uniform(seed, offset + i) * scale);
}

}  // namespace

Seeds seeds_for(uint64_t base) {
  return {hash64(base ^ 1), hash64(base ^ 2), hash64(base ^ 3),
          hash64(base ^ 4), hash64(base ^ 5), hash64(base ^ 6)};
}

// hash_uniform has variance 1/3: these give rows of unit-order magnitude.
float w13_scale(const MoEConfig& c) { return std::sqrt(3.0f / c.experts.hidden); }
float w2_scale(const MoEConfig& c) { return std::sqrt(3.0f / c.experts.intermediate); }

std::vector<float> make_logits(const MoEConfig& c, int num_tokens, uint64_t seed,
                               const std::string& routing) {
  const int e = c.routing.num_experts;
  std::vector<float> logits(static_cast<std::size_t>(num_tokens) * e);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    float v = hash_uniform(seed, 3 * i) + hash_uniform(seed, 3 * i + 1) + hash_uniform(seed, 3 * i + 2);
    if (routing == "skewed") v -= 1.5f * std::log1p(static_cast<float>(i % e));
    logits[i] = v;
  }
  return logits;
}

std::vector<float> host_x(const MoEConfig& c, int num_tokens, const Seeds& s) {
  std::vector<float> x(static_cast<std::size_t>(num_tokens) * c.experts.hidden);
  fill_bf16(x, 0, s.x, kXScale);
  return x;
}

std::vector<float> host_bias(const MoEConfig& c, const Seeds& s) {
  std::vector<float> b(c.routing.num_experts);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = kRoutingBiasScale * hash_uniform(s.bias, i);
  return b;
}

ref::ExpertView HostWeights::view(int e) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(e);
  if (it == cache_.end()) {
    const std::size_t h = c_.experts.hidden, i = c_.experts.intermediate, n1 = c_.gemm1_cols();
    Expert x;
    x.w13.resize(n1 * h);
    x.w2.resize(h * i);
    fill_bf16(x.w13, e * n1 * h, s_.w13, w13_scale(c_));
    fill_bf16(x.w2, e * h * i, s_.w2, w2_scale(c_));
    if (c_.experts.has_bias) {
      x.b13.resize(n1);
      x.b2.resize(h);
      for (std::size_t j = 0; j < n1; ++j) x.b13[j] = kBiasScale * hash_uniform(s_.b13, e * n1 + j);
      for (std::size_t j = 0; j < h; ++j) x.b2[j] = kBiasScale * hash_uniform(s_.b2, e * h + j);
    }
    it = cache_.emplace(e, std::move(x)).first;
  }
  const Expert& x = it->second;
  return {x.w13.data(), x.w2.data(), x.b13.empty() ? nullptr : x.b13.data(),
          x.b2.empty() ? nullptr : x.b2.data()};
}

}  // namespace unimoe::ref
