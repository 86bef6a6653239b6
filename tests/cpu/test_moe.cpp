// The reference activations and MoE forward. moe_forward (permuted, blocked,
// threaded) is checked against a naive dense loop over (token, k) written
// here from the formulas alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "core/hash_random.h"
#include "ref/ref.h"

namespace unimoe::ref {
namespace {

// ------------------------------------------------------------ activations ----

TEST(Activate, KnownValues) {
  const double alpha = 1.702, limit = 7.0;
  EXPECT_DOUBLE_EQ(activate(Activation::SwiGLU, 1.0, 2.0, alpha, limit),
                   2.0 / (1.0 + std::exp(-1.0)));
  EXPECT_EQ(activate(Activation::SwiGLU, 0.0, 5.0, alpha, limit), 0.0);
  EXPECT_DOUBLE_EQ(activate(Activation::SwiGLU, -2.0, 1.0, alpha, limit),
                   -2.0 / (1.0 + std::exp(2.0)));

  // gelu(x) = x * Phi(x); Phi(1) = 0.8413447460685429, Phi(-1) = 0.15865525393145707.
  EXPECT_EQ(activate(Activation::GeGLU, 0.0, 3.0, alpha, limit), 0.0);
  EXPECT_NEAR(activate(Activation::GeGLU, 1.0, 1.0, alpha, limit), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(activate(Activation::GeGLU, -1.0, 2.0, alpha, limit), -2 * 0.15865525393145707,
              1e-15);

  EXPECT_EQ(activate(Activation::ReLU2, -3.0, 100.0, alpha, limit), 0.0);
  EXPECT_EQ(activate(Activation::ReLU2, 3.0, 100.0, alpha, limit), 9.0);
  EXPECT_EQ(activate(Activation::ReLU2, 0.5, -7.0, alpha, limit), 0.25);
}

TEST(Activate, SwiGLUOaiClampsAtLimit) {
  const double alpha = 1.702, limit = 7.0;
  auto sigmoid = [](double z) { return 1.0 / (1.0 + std::exp(-z)); };
  // Inside the limits: g * sigmoid(alpha g) * (u + 1).
  EXPECT_DOUBLE_EQ(activate(Activation::SwiGLUOai, 1.5, 0.5, alpha, limit),
                   1.5 * sigmoid(alpha * 1.5) * 1.5);
  // g above the limit is cut to 7; u beyond +-7 to +-7.
  const double at_limit = 7.0 * sigmoid(alpha * 7.0);
  EXPECT_DOUBLE_EQ(activate(Activation::SwiGLUOai, 12.0, 20.0, alpha, limit), at_limit * 8.0);
  EXPECT_DOUBLE_EQ(activate(Activation::SwiGLUOai, 7.5, -20.0, alpha, limit), at_limit * -6.0);
  // g is not clamped from below.
  EXPECT_DOUBLE_EQ(activate(Activation::SwiGLUOai, -9.0, 1.0, alpha, limit),
                   -9.0 * sigmoid(-alpha * 9.0) * 2.0);
  // alpha and limit are the caller's.
  EXPECT_DOUBLE_EQ(activate(Activation::SwiGLUOai, 3.0, 3.0, 1.0, 2.0), 2.0 * sigmoid(2.0) * 3.0);
}

TEST(Activate, NaNPropagates) {
  const double nan = std::nan("");
  for (Activation a :
       {Activation::SwiGLU, Activation::GeGLU, Activation::ReLU2, Activation::SwiGLUOai})
    EXPECT_TRUE(std::isnan(activate(a, nan, 1.0, 1.702, 7.0))) << to_string(a);
}

// ------------------------------------------------------------ moe_forward ----

struct Case {
  Activation act;
  int tokens, hidden, inter, experts, top_k;
  int local_offset = 0, num_local = -1;
  bool bias = false;
  float limit = 7.0f;
  QuantVariant quant = QuantVariant::BF16;
};

MoEConfig make_config(const Case& c) {
  MoEConfig config;
  config.routing.num_experts = c.experts;
  config.routing.top_k = c.top_k;
  config.experts.hidden = c.hidden;
  config.experts.intermediate = c.inter;
  config.experts.activation = c.act;
  config.experts.swiglu_limit = c.limit;
  config.experts.has_bias = c.bias;
  config.experts.local_expert_offset = c.local_offset;
  config.experts.num_local_experts = c.num_local;
  config.experts.quant = c.quant;
  return config;
}

std::vector<float> random_bf16(size_t n, float scale, std::mt19937_64& rng) {
  std::vector<float> v = test::random_vector(n, rng, -scale, scale);
  for (float& x : v) x = round_bf16(x);
  return v;
}

// K distinct experts per token.
std::vector<int32_t> random_ids(int tokens, int top_k, int experts, std::mt19937_64& rng) {
  std::vector<int32_t> all(experts), ids;
  std::iota(all.begin(), all.end(), 0);
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + top_k);
  }
  return ids;
}

Routing random_routing(const Case& c, std::mt19937_64& rng) {
  Routing r;
  r.num_tokens = c.tokens;
  r.top_k = c.top_k;
  r.ids = random_ids(c.tokens, c.top_k, c.experts, rng);
  r.weights = test::random_vector(r.ids.size(), rng, 0.0f, 1.0f);
  return r;
}

// The local experts' weights, plus a count of the source's calls per expert.
struct Experts {
  std::vector<std::vector<float>> w13, w2, b13, b2;
  std::vector<int> calls;
  std::mutex mutex;

  Experts(const MoEConfig& config, std::mt19937_64& rng) {
    const int n = config.local_experts(), h = config.experts.hidden,
              i = config.experts.intermediate;
    const int cols = config.gemm1_cols();
    for (int e = 0; e < n; ++e) {
      w13.push_back(random_bf16(static_cast<size_t>(cols) * h, 1.0f / std::sqrt(float(h)), rng));
      w2.push_back(random_bf16(static_cast<size_t>(h) * i, 1.0f / std::sqrt(float(i)), rng));
      if (config.experts.has_bias) {
        b13.push_back(test::random_vector(cols, rng, -0.5f, 0.5f));
        b2.push_back(test::random_vector(h, rng, -0.5f, 0.5f));
      }
    }
    calls.assign(n, 0);
  }

  WeightSource source() {
    return [this](int e) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++calls.at(e);
      }
      ExpertView v{w13[e].data(), w2[e].data()};
      if (!b13.empty()) v.b13 = b13[e].data(), v.b2 = b2[e].data();
      return v;
    };
  }
};

double naive_activation(const MoEConfig& config, double g, double u) {
  const double alpha = config.experts.swiglu_alpha, limit = config.experts.swiglu_limit;
  switch (config.experts.activation) {
    case Activation::SwiGLU:
      return g / (1 + std::exp(-g)) * u;
    case Activation::GeGLU:
      return g * 0.5 * std::erfc(-g / std::sqrt(2.0)) * u;
    case Activation::ReLU2:
      return g > 0 ? g * g : 0;
    case Activation::SwiGLUOai:
      g = std::min(g, limit);
      u = std::clamp(u, -limit, limit);
      return g / (1 + std::exp(-alpha * g)) * (u + 1);
  }
  return NAN;
}

// Dense loop over (token, k): no permutation, no blocking, one sum at a time.
// The activation tensor a [on-rank rows, I] is rounded in one call, in
// (token, k) order, which is how a per-tensor scale sees it too.
std::vector<float> naive_forward(const MoEConfig& config, const Experts& w, const float* x,
                                 const Routing& r) {
  const int h = config.experts.hidden, inter = config.experts.intermediate;
  const int offset = config.experts.local_expert_offset, n_local = config.local_experts();
  const bool gated = config.experts.activation != Activation::ReLU2;
  std::vector<float> xq(x, x + static_cast<size_t>(r.num_tokens) * h);
  quantize_activation(config.experts.quant, xq.data(), r.num_tokens, h);

  std::vector<int> rows;  // expanded indices on this rank
  std::vector<float> a;
  for (int i = 0; i < r.num_tokens * r.top_k; ++i) {
    const int e = r.ids[i] - offset;
    if (e < 0 || e >= n_local) continue;
    rows.push_back(i);
    const float* xt = xq.data() + static_cast<size_t>(i / r.top_k) * h;
    for (int j = 0; j < inter; ++j) {
      double g = w.b13.empty() ? 0.0 : w.b13[e][j];
      double u = w.b13.empty() || !gated ? 0.0 : w.b13[e][inter + j];
      for (int c = 0; c < h; ++c) g += double(w.w13[e][size_t(j) * h + c]) * xt[c];
      if (gated)
        for (int c = 0; c < h; ++c) u += double(w.w13[e][size_t(inter + j) * h + c]) * xt[c];
      a.push_back(static_cast<float>(naive_activation(config, g, u)));
    }
  }
  quantize_activation(config.experts.quant, a.data(), static_cast<int>(rows.size()), inter);

  std::vector<double> out(static_cast<size_t>(r.num_tokens) * h, 0.0);
  for (size_t n = 0; n < rows.size(); ++n) {
    const int i = rows[n], e = r.ids[i] - offset;
    for (int c = 0; c < h; ++c) {
      double y = w.b2.empty() ? 0.0 : w.b2[e][c];
      for (int j = 0; j < inter; ++j)
        y += double(w.w2[e][size_t(c) * inter + j]) * a[n * inter + j];
      out[size_t(i / r.top_k) * h + c] += double(r.weights[i]) * y;
    }
  }
  return std::vector<float>(out.begin(), out.end());
}

std::string describe(const Case& c) {
  return to_string(c.act) + " " + to_string(c.quant) + " T" + std::to_string(c.tokens) + " H" +
         std::to_string(c.hidden) + " I" + std::to_string(c.inter) + " E" +
         std::to_string(c.experts) + " K" + std::to_string(c.top_k) + " local [" +
         std::to_string(c.local_offset) + ", +" + std::to_string(c.num_local) + ")" +
         (c.bias ? " bias" : "");
}

// Runs one case against the naive loop and checks the weight source's calls.
void check_against_naive(const Case& c, std::mt19937_64& rng, Routing routing) {
  SCOPED_TRACE(describe(c));
  const MoEConfig config = make_config(c);
  Experts experts(config, rng);
  const std::vector<float> x = random_bf16(static_cast<size_t>(c.tokens) * c.hidden, 1.0f, rng);
  const std::vector<float> got = moe_forward(config, experts.source(), x.data(), routing, 2);
  const std::vector<float> want = naive_forward(config, experts, x.data(), routing);
  EXPECT_LT(test::rel_l2(got, want), 1e-12);

  for (int e = 0; e < config.local_experts(); ++e) {
    const int global = e + c.local_offset;
    const bool hit = std::count(routing.ids.begin(), routing.ids.end(), global) > 0;
    EXPECT_EQ(experts.calls[e], hit ? 1 : 0) << "weight source calls for local expert " << e;
  }
}

TEST(MoeForward, MatchesNaiveLoop) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Case cases[] = {
      {Activation::SwiGLU, 1, 24, 40, 8, 2},
      {Activation::SwiGLU, 3, 24, 40, 8, 2},
      {Activation::SwiGLU, 7, 56, 32, 6, 3},
      {Activation::GeGLU, 3, 32, 16, 6, 3},
      {Activation::GeGLU, 7, 40, 72, 4, 4},
      {Activation::ReLU2, 7, 40, 24, 5, 2},
      {Activation::ReLU2, 1, 8, 8, 3, 1},
      {Activation::SwiGLUOai, 7, 64, 48, 4, 2, 0, -1, true},
      // A small limit so that both clamps are exercised.
      {Activation::SwiGLUOai, 3, 24, 40, 8, 3, 0, -1, true, 0.25f},
      {Activation::SwiGLU, 9, 24, 136, 40, 8, 0, -1, true},
  };
  for (const Case& c : cases) check_against_naive(c, rng, random_routing(c, rng));
}

TEST(MoeForward, ExpertParallelRangeIgnoresOffRankRows) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Case c{Activation::SwiGLU, 7, 32, 24, 16, 4, 4, 6};
  Routing routing = random_routing(c, rng);
  // Token 0 is wholly off rank [4, 10).
  std::copy_n(std::vector<int32_t>{0, 1, 2, 3}.begin(), 4, routing.ids.begin());
  check_against_naive(c, rng, routing);

  const MoEConfig config = make_config(c);
  Experts experts(config, rng);
  const std::vector<float> x = random_bf16(static_cast<size_t>(c.tokens) * c.hidden, 1.0f, rng);
  const std::vector<float> out = moe_forward(config, experts.source(), x.data(), routing, 2);
  for (int h = 0; h < c.hidden; ++h) EXPECT_EQ(out[h], 0.0f) << "token 0 is wholly off rank";
  // Moving a row off rank changes only its own token.
  Routing moved = routing;
  moved.ids[1 * c.top_k] = 15;
  const std::vector<float> out2 = moe_forward(config, experts.source(), x.data(), moved, 2);
  for (int t = 0; t < c.tokens; ++t) {
    const bool same = std::equal(out.begin() + t * c.hidden, out.begin() + (t + 1) * c.hidden,
                                 out2.begin() + t * c.hidden);
    const bool was_local = routing.ids[c.top_k] >= 4 && routing.ids[c.top_k] < 10;
    EXPECT_EQ(same, t != 1 || !was_local) << "token " << t;
  }
}

TEST(MoeForward, Fp8ActivationScales) {
  // FP8PerTensor: one scale over the whole [rows, I] activation tensor, which
  // the naive loop applies in one call too; FP8Block128: per row and 128.
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Case cases[] = {
      {Activation::SwiGLU, 7, 48, 32, 6, 2, 0, -1, false, 7.0f, QuantVariant::FP8PerTensor},
      {Activation::SwiGLUOai, 5, 32, 64, 8, 3, 2, 5, true, 7.0f, QuantVariant::FP8PerTensor},
      {Activation::GeGLU, 3, 128, 256, 4, 2, 0, -1, false, 7.0f, QuantVariant::FP8Block128},
  };
  for (const Case& c : cases) check_against_naive(c, rng, random_routing(c, rng));
}

// One token routed to expert 0 with the given weight (K = 1).
Routing one_token_to_expert_0(float weight) {
  Routing routing;
  routing.num_tokens = 1;
  routing.top_k = 1;
  routing.ids = {0};
  routing.weights = {weight};
  return routing;
}

// The flip allowance: one token, one expert, ReLU2 (act = g^2) with a
// static activation scale of 1, so that the one intermediate element is
// 19.00002, 1e-6 (relative) above the boundary 19 between the e4m3 codes 18
// and 20. Rounded to 20 by the reference, to 18 on the other side: the
// allowance is |w| * 2 * ||w2's column||, and 0 for an element far from
// any boundary and for BF16.
TEST(MoeForward, FlipAllowanceCountsNearTiesOnly) {
  MoEConfig config = make_config(
      {Activation::ReLU2, 1, 16, 16, 1, 1, 0, -1, false, 7.0f, QuantVariant::FP8PerTensor});
  // x = e_0; w13 row 0 (the first intermediate column) = sqrt(19.00002) e_0,
  // the other rows 0; w2's column 0 = (0.5, -0.25, 0, 1, 0, ...).
  std::vector<float> x(16, 0.0f), w13(16 * 16, 0.0f), w2(16 * 16, 0.0f);
  x[0] = 1.0f;
  w13[0] = std::sqrt(19.00002f);
  w2[0 * 16] = 0.5f;
  w2[1 * 16] = -0.25f;
  w2[3 * 16] = 1.0f;  // column 0's norm: sqrt(1.3125)
  const WeightSource source = [&](int) { return ExpertView{w13.data(), w2.data()}; };
  const Routing routing = one_token_to_expert_0(0.75f);
  const ActivationScales scales{1.0f, 1.0f};
  double allowance = -1.0;
  const std::vector<float> out = moe_forward(config, source, x.data(), routing, 1, scales, &allowance);
  EXPECT_FLOAT_EQ(out[0], 0.75f * 20.0f * 0.5f);  // the reference rounds 19.00002 up to 20
  EXPECT_NEAR(allowance, 0.75 * 2.0 * std::sqrt(1.3125), 1e-6);
  w13[0] = std::sqrt(19.5f);  // 19.5: far from both boundaries (19 and 21)
  moe_forward(config, source, x.data(), routing, 1, scales, &allowance);
  EXPECT_EQ(allowance, 0.0);
  config.experts.quant = QuantVariant::BF16;
  w13[0] = std::sqrt(19.00002f);
  moe_forward(config, source, x.data(), routing, 1, {}, &allowance);
  EXPECT_EQ(allowance, 0.0);
}

// Two tokens with one such element each: their output rows are disjoint, so
// the allowances add in quadrature; a token whose routing weight is not
// finite (its output row is not either, and checks skip it) adds nothing.
TEST(MoeForward, FlipAllowanceAddsTokensInQuadrature) {
  MoEConfig config = make_config(
      {Activation::ReLU2, 1, 16, 16, 1, 1, 0, -1, false, 7.0f, QuantVariant::FP8PerTensor});
  std::vector<float> x(2 * 16, 0.0f), w13(16 * 16, 0.0f), w2(16 * 16, 0.0f);
  x[0] = x[16] = 1.0f;
  w13[0] = std::sqrt(19.00002f);
  w2[0] = 1.0f;  // column 0's norm: 1
  const WeightSource source = [&](int) { return ExpertView{w13.data(), w2.data()}; };
  Routing routing;
  routing.num_tokens = 2;
  routing.top_k = 1;
  routing.ids = {0, 0};
  routing.weights = {0.75f, 0.5f};
  const ActivationScales scales{1.0f, 1.0f};
  double allowance = -1.0;
  moe_forward(config, source, x.data(), routing, 1, scales, &allowance);
  EXPECT_NEAR(allowance, std::hypot(0.75 * 2.0, 0.5 * 2.0), 1e-6);
  routing.weights[1] = std::numeric_limits<float>::infinity();
  moe_forward(config, source, x.data(), routing, 1, scales, &allowance);
  EXPECT_NEAR(allowance, 0.75 * 2.0, 1e-6);
  EXPECT_NEAR(relative_flip_allowance(3.0, {0.0f, 4.0f, std::nanf(""), 3.0f}), 0.6, 1e-12);
  EXPECT_EQ(relative_flip_allowance(3.0, {0.0f}), 0.0);
}

// The coarser GEMM1 sums of the FP8 wgmma paths: one element 19.01, 5e-4
// (relative) above the boundary 19, beyond kFlipMargin, as the sum of two
// terms of magnitude 100 and 95.6. Sums off by kFp8WgmmaSumPrecision of
// their terms' magnitudes (0.012) move g^2 by up to 0.11: the element may
// round to 18 too, and the allowance counts it; with fp32-class sums it
// does not. One such element a token: its quadrature sum is its own term.
TEST(MoeForward, FlipAllowanceWidensForCoarserGemm1Sums) {
  MoEConfig config = make_config(
      {Activation::ReLU2, 1, 16, 16, 1, 1, 0, -1, false, 7.0f, QuantVariant::FP8PerTensor});
  std::vector<float> x(16, 0.0f), w13(16 * 16, 0.0f), w2(16 * 16, 0.0f);
  x[0] = x[1] = 1.0f;
  w13[0] = 100.0f;
  w13[1] = -(100.0f - std::sqrt(19.01f));
  w2[0] = 1.0f;  // column 0's norm: 1
  const WeightSource source = [&](int) { return ExpertView{w13.data(), w2.data()}; };
  const Routing routing = one_token_to_expert_0(0.75f);
  const ActivationScales scales{1.0f, 1.0f};
  double allowance = -1.0;
  const std::vector<float> out = moe_forward(config, source, x.data(), routing, 1, scales, &allowance);
  EXPECT_FLOAT_EQ(out[0], 0.75f * 20.0f);  // 19.01 rounds to 20
  EXPECT_EQ(allowance, 0.0);
  moe_forward(config, source, x.data(), routing, 1, scales, &allowance, kFp8WgmmaSumPrecision);
  EXPECT_NEAR(allowance, 0.75 * 2.0, 1e-6);
  // 19.3: 0.3 from the boundary, beyond what those sums move: nothing.
  w13[1] = -(100.0f - std::sqrt(19.3f));
  moe_forward(config, source, x.data(), routing, 1, scales, &allowance, kFp8WgmmaSumPrecision);
  EXPECT_EQ(allowance, 0.0);
}

TEST(MoeForward, ThreadCountDoesNotChangeBits) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Case c{Activation::SwiGLUOai, 37, 96, 80, 8, 3, 0, -1, true};
  const MoEConfig config = make_config(c);
  Experts experts(config, rng);
  const Routing routing = random_routing(c, rng);
  const std::vector<float> x = random_bf16(static_cast<size_t>(c.tokens) * c.hidden, 1.0f, rng);
  const std::vector<float> one = moe_forward(config, experts.source(), x.data(), routing, 1);
  for (int threads : {2, 3, 0}) {
    const std::vector<float> many =
        moe_forward(config, experts.source(), x.data(), routing, threads);
    ASSERT_EQ(many.size(), one.size());
    EXPECT_EQ(std::memcmp(many.data(), one.data(), one.size() * sizeof(float)), 0)
        << threads << " threads";
  }
}

TEST(MoeForward, BiasesFollowTheConfig) {
  // A source that hands out biases for a config without them: they are unused.
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Case with{Activation::SwiGLU, 5, 32, 24, 6, 2, 0, -1, true};
  Case without = with;
  without.bias = false;
  Experts experts(make_config(with), rng);
  const Routing routing = random_routing(with, rng);
  const std::vector<float> x =
      random_bf16(static_cast<size_t>(with.tokens) * with.hidden, 1.0f, rng);
  const std::vector<float> got =
      moe_forward(make_config(without), experts.source(), x.data(), routing);
  experts.b13.clear();
  experts.b2.clear();
  EXPECT_LT(test::rel_l2(got, naive_forward(make_config(without), experts, x.data(), routing)),
            1e-12);
}

TEST(MoeForward, ZeroTokens) {
  std::mt19937_64 rng(1);
  const Case c{Activation::SwiGLU, 0, 16, 16, 4, 2};
  const MoEConfig config = make_config(c);
  Experts experts(config, rng);
  Routing routing;
  routing.top_k = 2;
  EXPECT_TRUE(moe_forward(config, experts.source(), nullptr, routing).empty());
  EXPECT_EQ(std::accumulate(experts.calls.begin(), experts.calls.end(), 0), 0);
}

TEST(MoeForward, RejectsBadArguments) {
  std::mt19937_64 rng(2);
  const Case c{Activation::SwiGLU, 2, 16, 16, 4, 2};
  const MoEConfig config = make_config(c);
  Experts experts(config, rng);
  const Routing routing = random_routing(c, rng);
  const std::vector<float> x(2 * 16, 0.5f);
  EXPECT_NO_THROW(moe_forward(config, experts.source(), x.data(), routing));
  EXPECT_THROW(moe_forward(config, experts.source(), nullptr, routing), std::invalid_argument);
  EXPECT_THROW(moe_forward(config, experts.source(), x.data(), routing, -1), std::invalid_argument);

  Routing bad = routing;
  bad.top_k = 3;
  EXPECT_THROW(moe_forward(config, experts.source(), x.data(), bad), std::invalid_argument);
  bad = routing;
  bad.weights.pop_back();
  EXPECT_THROW(moe_forward(config, experts.source(), x.data(), bad), std::invalid_argument);
  bad = routing;
  bad.num_tokens = -1;
  EXPECT_THROW(moe_forward(config, experts.source(), x.data(), bad), std::invalid_argument);

  MoEConfig wrong = config;
  wrong.experts.hidden = 12;  // not a multiple of 8
  EXPECT_THROW(moe_forward(wrong, experts.source(), x.data(), routing), Error);
  wrong = config;
  wrong.experts.has_bias = true;  // the source has no biases
  EXPECT_THROW(moe_forward(wrong, experts.source(), x.data(), routing), std::invalid_argument);
  const WeightSource failing = [](int) -> ExpertView { throw std::runtime_error("no weights"); };
  EXPECT_THROW(moe_forward(config, failing, x.data(), routing), std::runtime_error);
}

TEST(MoeForward, DeepSeekV3SizedLayerIsFast) {
  // E 256, H 7168, I 2048, K 8, T 2: weights from hash_uniform, generated only
  // for the hit experts. Both tokens pick the same 8 experts (in another
  // order): 16 rows of work, but half the 176 MB-an-expert weights to build.
  // A spot check of token 0 against the formulas.
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Case c{Activation::SwiGLU, 2, 7168, 2048, 256, 8};
  const int h = c.hidden, inter = c.inter;
  const MoEConfig config = make_config(c);
  Routing routing = random_routing(c, rng);
  std::copy_n(routing.ids.begin(), c.top_k, routing.ids.begin() + c.top_k);
  std::shuffle(routing.ids.begin() + c.top_k, routing.ids.end(), rng);
  const std::vector<float> x = random_bf16(static_cast<size_t>(c.tokens) * h, 1.0f, rng);

  std::vector<std::vector<float>> w13(c.experts), w2(c.experts);
  auto generate = [&](int e) {
    w13[e].resize(size_t(2) * inter * h);
    w2[e].resize(size_t(h) * inter);
    for (size_t i = 0; i < w13[e].size(); ++i)
      w13[e][i] = hash_uniform(seed + 2 * e, i) / std::sqrt(float(h));
    for (size_t i = 0; i < w2[e].size(); ++i)
      w2[e][i] = hash_uniform(seed + 2 * e + 1, i) / std::sqrt(float(h));
  };
  std::vector<int> hit(routing.ids.begin(), routing.ids.end());
  std::sort(hit.begin(), hit.end());
  hit.erase(std::unique(hit.begin(), hit.end()), hit.end());
  std::thread helper([&] {
    for (size_t i = 1; i < hit.size(); i += 2) generate(hit[i]);
  });
  for (size_t i = 0; i < hit.size(); i += 2) generate(hit[i]);
  helper.join();

  const WeightSource source = [&](int e) {
    EXPECT_FALSE(w13[e].empty()) << "expert " << e << " is not hit";
    return ExpertView{w13[e].data(), w2[e].data()};
  };
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float> out = moe_forward(config, source, x.data(), routing, 2);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("DeepSeek-V3-sized moe_forward, T 2, 2 threads: %.2f s\n", seconds);
  EXPECT_LT(seconds, 10.0);  // a few seconds leaves room for a shared machine

  const int cols[] = {0, 1, h / 2 - 1, h - 1};
  double want[4] = {};
  std::vector<float> a(inter);
  for (int k = 0; k < c.top_k; ++k) {
    const int e = routing.ids[k];
    for (int j = 0; j < inter; ++j) {
      double g = 0, u = 0;
      for (int i = 0; i < h; ++i) g += double(w13[e][size_t(j) * h + i]) * x[i];
      for (int i = 0; i < h; ++i) u += double(w13[e][size_t(inter + j) * h + i]) * x[i];
      a[j] = round_bf16(float(g / (1 + std::exp(-g)) * u));
    }
    for (int n = 0; n < 4; ++n) {
      double y = 0;
      for (int j = 0; j < inter; ++j) y += double(w2[e][size_t(cols[n]) * inter + j]) * a[j];
      want[n] += double(routing.weights[k]) * y;
    }
  }
  for (int n = 0; n < 4; ++n)
    EXPECT_NEAR(out[cols[n]], want[n], 1e-6 * std::abs(want[n])) << "column " << cols[n];
}

}  // namespace
}  // namespace unimoe::ref
