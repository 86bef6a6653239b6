#include "ref/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <utility>

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

namespace {

struct Distribution {
  enum Kind { Uniform, Skewed, Zipf, Hot } kind = Uniform;
  double param = 0;  // S of zipf, P of hot
};

Distribution parse_distribution(const std::string& name, const std::string& field) {
  if (name == "uniform") return {};
  if (name == "skewed") return {Distribution::Skewed, 0};
  const std::size_t colon = name.find(':');
  const std::string kind = name.substr(0, colon);
  const auto refuse = [&](const std::string& why) {
    throw Error(field, "is '" + name + "'; " + why +
                           " (allowed: uniform, skewed, zipf:S with S > 0, hot:P with 0 < P <= 1)");
  };
  if (colon == std::string::npos || (kind != "zipf" && kind != "hot")) refuse("unknown distribution");
  const std::string value = name.substr(colon + 1);
  double v = 0;
  std::size_t used = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    refuse("'" + value + "' is not a number");
  }
  if (used != value.size() || !std::isfinite(v)) refuse("'" + value + "' is not a number");
  if (kind == "zipf" && !(v > 0)) refuse("S must be > 0");
  if (kind == "hot" && !(v > 0 && v <= 1)) refuse("P must be in (0, 1]");
  return {kind == "zipf" ? Distribution::Zipf : Distribution::Hot, v};
}

// A uniform draw in (0, 1] from value i of stream `seed`.
double unit_draw(uint64_t seed, uint64_t i) { return (1.0 - hash_uniform(seed, i)) / 2.0; }

}  // namespace

void check_routing_distribution(const std::string& name, const std::string& field) {
  parse_distribution(name, field);
}

int hot_expert(int num_experts) {
  return static_cast<int>(hash64(0x4057ull ^ static_cast<uint64_t>(num_experts)) %
                          static_cast<uint64_t>(num_experts));
}

std::vector<int> popularity_order(int num_experts) {
  std::vector<int> order(num_experts);
  for (int i = 0; i < num_experts; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [](int a, int b) {
    return hash64(0x21ffull ^ static_cast<uint64_t>(a)) < hash64(0x21ffull ^ static_cast<uint64_t>(b));
  });
  return order;
}

std::vector<float> make_logits(const MoEConfig& c, int num_tokens, uint64_t seed,
                               const std::string& routing) {
  const Distribution d = parse_distribution(routing, "routing");
  const int e = c.routing.num_experts;
  std::vector<float> logits(static_cast<std::size_t>(num_tokens) * e);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    float v = hash_uniform(seed, 3 * i) + hash_uniform(seed, 3 * i + 1) + hash_uniform(seed, 3 * i + 2);
    if (d.kind == Distribution::Skewed) v -= 1.5f * std::log1p(static_cast<float>(i % e));
    logits[i] = v;
  }
  // Draws of their own stream, apart from the noise's.
  const uint64_t draws = hash64(seed ^ 0xd157ull);
  if (d.kind == Distribution::Hot) {
    const int hot = hot_expert(e);
    for (int t = 0; t < num_tokens; ++t)
      if (unit_draw(draws, static_cast<uint64_t>(t)) <= d.param)
        logits[static_cast<std::size_t>(t) * e + hot] += kChosenMargin;
  } else if (d.kind == Distribution::Zipf) {
    // Weighted sampling without replacement: the K largest keys
    // log(u) / weight (Efraimidis and Spirakis) over the experts.
    const std::vector<int> order = popularity_order(e);
    std::vector<double> inv_weight(e);
    for (int r = 0; r < e; ++r) inv_weight[order[r]] = std::pow(r + 1.0, d.param);
    const int k = std::min(c.routing.top_k, e);
    std::vector<std::pair<double, int>> keys(e);
    for (int t = 0; t < num_tokens; ++t) {
      for (int x = 0; x < e; ++x) {
        const uint64_t i = static_cast<uint64_t>(t) * e + x;
        keys[x] = {std::log(unit_draw(draws, i)) * inv_weight[x], x};
      }
      std::partial_sort(keys.begin(), keys.begin() + k, keys.end(), std::greater<>());
      for (int j = 0; j < k; ++j) logits[static_cast<std::size_t>(t) * e + keys[j].second] += kChosenMargin;
    }
  }
  return logits;
}

DeviceLogits device_logits(const std::vector<float>& logits, LogitsType type) {
  DeviceLogits d;
  if (type == LogitsType::F32) {
    d.values = logits;
    d.bytes.resize(logits.size() * sizeof(float));
    std::memcpy(d.bytes.data(), logits.data(), d.bytes.size());
    return d;
  }
  d.values.resize(logits.size());
  d.bytes.resize(logits.size() * sizeof(uint16_t));
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const uint16_t bits = f32_to_bf16(logits[i]);
    std::memcpy(d.bytes.data() + i * sizeof(uint16_t), &bits, sizeof(bits));
    d.values[i] = bf16_to_f32(bits);
  }
  return d;
}

SyntheticInputs synthetic_inputs(const MoEConfig& c, int num_tokens, const Seeds& s, int set,
                                 const std::string& routing) {
  SyntheticInputs in;
  in.x_seed = s.x + static_cast<uint64_t>(set);
  const uint64_t logits_seed = s.x ^ static_cast<uint64_t>(num_tokens + 1000 * set);
  in.logits = device_logits(make_logits(c, num_tokens, logits_seed, routing), c.routing.logits_type);
  return in;
}

std::vector<float> host_x(const MoEConfig& c, int num_tokens, uint64_t x_seed) {
  std::vector<float> x(static_cast<std::size_t>(num_tokens) * c.experts.hidden);
  fill_bf16(x, 0, x_seed, kXScale);
  return x;
}

std::vector<float> host_x_rows(const MoEConfig& c, const std::vector<int>& rows, uint64_t x_seed) {
  const std::size_t h = c.experts.hidden;
  std::vector<float> x(rows.size() * h), row(h);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    fill_bf16(row, rows[i] * h, x_seed, kXScale);
    std::copy(row.begin(), row.end(), x.begin() + i * h);
  }
  return x;
}

std::vector<float> host_x(const MoEConfig& c, int num_tokens, const Seeds& s) {
  return host_x(c, num_tokens, s.x);
}

std::vector<float> host_bias(const MoEConfig& c, const Seeds& s) {
  std::vector<float> b(c.routing.num_experts);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = kRoutingBiasScale * hash_uniform(s.bias, i);
  return b;
}

ref::ExpertView HostWeights::view(int e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(e); it != cache_.end()) return it->second.view();
  }
  // Generated outside the lock, so that the reference's threads build
  // different experts at once; a rare second build of one expert is dropped.
  const std::size_t h = c_.experts.hidden, i = c_.experts.intermediate, n1 = c_.gemm1_cols();
  Expert x;
  x.w13.resize(n1 * h);
  x.w2.resize(h * i);
  fill_bf16(x.w13, e * n1 * h, s_.w13, w13_scale(c_));
  fill_bf16(x.w2, e * h * i, s_.w2, w2_scale(c_));
  const QuantVariant q = c_.experts.quant;
  if (q != QuantVariant::BF16) {
    // What the device's weights mean: the bf16 values quantized one expert
    // matrix at a time (kernels/quant/fp8_weights.cuh, fp4_weights.cuh),
    // then dequantized.
    x.w13 = dequantize(quantize(q, x.w13.data(), static_cast<int>(n1), static_cast<int>(h)));
    x.w2 = dequantize(quantize(q, x.w2.data(), static_cast<int>(h), static_cast<int>(i)));
  }
  if (c_.experts.has_bias) {
    x.b13.resize(n1);
    x.b2.resize(h);
    for (std::size_t j = 0; j < n1; ++j) x.b13[j] = kBiasScale * hash_uniform(s_.b13, e * n1 + j);
    for (std::size_t j = 0; j < h; ++j) x.b2[j] = kBiasScale * hash_uniform(s_.b2, e * h + j);
  }
  std::lock_guard<std::mutex> lock(mu_);
  // unordered_map keeps its elements in place: the view stays valid.
  return cache_.emplace(e, std::move(x)).first->second.view();
}

}  // namespace unimoe::ref
