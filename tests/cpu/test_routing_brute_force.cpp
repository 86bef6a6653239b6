// The reference routing against an independent brute force on random
// logits (uniform, coarse with many ties, with NaN and -inf), for every
// policy and the shapes of real models; the weight sums; a DeepSeek-V3-sized
// batch. Hand-computed cases and edge rules: test_routing.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/routing_cases.h"
#include "common/test_util.h"
#include "ref/ref.h"

namespace unimoe::ref {
namespace {

using P = RoutingPolicy;
using test::kAllPolicies;
using test::kInf;
using test::kNaN;
using test::is_deepseek;
using test::make_config;
using test::row_of;
using test::weight_matches;


// -------------------------------------------------------- brute force ----
// Selection by a full stable sort of (key, index), descending (a stable sort
// keeps equal keys in index order); weights straight from the formula table.

struct Expected {
  std::vector<int32_t> ids;
  std::vector<double> weights;
};

using Keyed = std::pair<float, int>;

void sort_descending(std::vector<Keyed>& v) {
  std::stable_sort(v.begin(), v.end(),
                   [](const Keyed& a, const Keyed& b) { return a.first > b.first; });
}

float nan_as_neg_inf(float v) { return std::isnan(v) ? -kInf : v; }

std::vector<Keyed> deepseek_candidates(const RoutingConfig& c, const std::vector<float>& x,
                                       const float* bias) {
  const int e = c.num_experts;
  std::vector<float> key(e);
  for (int i = 0; i < e; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-x[i]));
    key[i] = nan_as_neg_inf(s + (bias ? bias[i] : 0.0f));
  }
  const int groups = c.policy == P::DeepSeekV3 ? c.n_group : 1;
  const int per = e / groups;
  std::vector<bool> kept(groups, groups == 1);
  if (groups > 1) {
    std::vector<Keyed> scores;
    for (int g = 0; g < groups; ++g) {
      std::vector<float> members(key.begin() + g * per, key.begin() + (g + 1) * per);
      std::sort(members.begin(), members.end(), [](float a, float b) { return a > b; });
      scores.push_back({nan_as_neg_inf(members[0] + members[1]), g});
    }
    sort_descending(scores);
    for (int j = 0; j < c.topk_group; ++j) kept[scores[j].second] = true;
  }
  std::vector<Keyed> out;
  for (int i = 0; i < e; ++i)
    if (kept[i / per]) out.push_back({key[i], i});
  return out;
}

Expected brute_force(const RoutingConfig& c, const float* logits, const float* bias) {
  const int e = c.num_experts, k = c.top_k;
  std::vector<float> x(logits, logits + e);
  for (float& v : x) v = nan_as_neg_inf(v);
  std::vector<Keyed> keyed;
  if (is_deepseek(c.policy)) {
    keyed = deepseek_candidates(c, x, bias);
  } else {
    for (int i = 0; i < e; ++i) keyed.push_back({x[i], i});
  }
  sort_descending(keyed);
  Expected out;
  for (int j = 0; j < k; ++j) out.ids.push_back(keyed[j].second);

  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  double all = 0, picked = 0, sig_sum = 0;
  for (int i = 0; i < e; ++i) all += std::exp(static_cast<double>(x[i]));
  for (int id : out.ids) {
    picked += std::exp(static_cast<double>(x[id]));
    sig_sum += sig(x[id]);
  }
  for (int id : out.ids) {
    const double xi = x[id], p = std::exp(xi) / all;
    double w = 0;
    switch (c.policy) {
      case P::Default: w = p; break;
      case P::Renormalize: w = std::exp(xi) / picked; break;
      case P::RenormalizeNaive: w = p / (picked / all); break;
      case P::TopK: w = xi; break;
      case P::Sigmoid:
      case P::TopKSigmoid:
      case P::Llama4: w = sig(xi); break;
      case P::SigmoidRenorm: w = sig(xi) / sig_sum; break;
      case P::DeepSeekV3:
      case P::MiniMax2: w = sig(xi) / (sig_sum + 1e-20) * c.routed_scaling_factor; break;
    }
    out.weights.push_back(w);
  }
  return out;
}

enum class Fill { Uniform, CoarseTies, SomeNonFinite };

// Logits per fill; SomeNonFinite keeps at least K finite values per token so
// that the plain formulas of the brute force stay defined.
std::vector<float> make_logits(Fill fill, int t, int e, int k, std::mt19937_64& rng) {
  std::vector<float> x = test::random_vector(static_cast<std::size_t>(t) * e, rng, -8.0f, 8.0f);
  std::uniform_int_distribution<int> grid(-6, 6), pick(0, e - 1), kind(0, 1);
  for (int row = 0; row < t; ++row) {
    float* r = x.data() + static_cast<std::size_t>(row) * e;
    if (fill == Fill::CoarseTies)
      for (int i = 0; i < e; ++i) r[i] = 0.5f * grid(rng);
    if (fill == Fill::SomeNonFinite)
      for (int n = 0; n < (e - k) / 3; ++n) r[pick(rng)] = kind(rng) ? kNaN : -kInf;
  }
  return x;
}

struct Shape {
  int e, k, n_group, topk_group;
};

TEST(RoutingBruteForce, MatchesEveryPolicy) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Shape shapes[] = {{4, 1, 1, 1},   {8, 2, 4, 2},    {160, 6, 1, 1},  {256, 8, 8, 4},
                          {1024, 32, 1, 1}, {64, 6, 16, 8}, {1024, 22, 16, 8}};
  for (P policy : kAllPolicies) {
    for (const Shape& sh : shapes) {
      // Groups are DeepSeekV3's alone; Llama4 routes to one expert.
      const bool grouped = policy == P::DeepSeekV3;
      const int k = policy == P::Llama4 ? 1 : sh.k;
      for (Fill fill : {Fill::Uniform, Fill::CoarseTies, Fill::SomeNonFinite}) {
        for (bool with_bias : {false, true}) {
          if (with_bias && !is_deepseek(policy)) continue;
          const RoutingConfig c = make_config(policy, sh.e, k, grouped ? sh.n_group : 1,
                                              grouped ? sh.topk_group : 1, 2.5f, with_bias);
          SCOPED_TRACE(to_string(policy) + " E=" + std::to_string(sh.e) +
                       " K=" + std::to_string(k) +
                       " groups=" + std::to_string(c.n_group) + "/" + std::to_string(c.topk_group) +
                       " fill=" + std::to_string(static_cast<int>(fill)) +
                       " bias=" + std::to_string(with_bias));
          const int t = sh.e >= 1024 ? 16 : 48;
          const std::vector<float> x = make_logits(fill, t, sh.e, k, rng);
          std::vector<float> bias = test::random_vector(sh.e, rng, -0.5f, 0.5f);
          if (fill == Fill::CoarseTies)
            for (float& b : bias) b = std::round(b * 4) / 4;  // equal c on equal logits
          const float* b = with_bias ? bias.data() : nullptr;
          const Routing r = route(c, x.data(), t, b);
          for (int row = 0; row < t; ++row) {
            const Expected want = brute_force(c, x.data() + std::size_t{1} * row * sh.e, b);
            ASSERT_EQ(row_of(r.ids, row, k), want.ids) << "token " << row;
            for (int j = 0; j < k; ++j)
              ASSERT_TRUE(weight_matches(r.weights[row * k + j], want.weights[j]))
                  << "token " << row << " slot " << j << ": got " << r.weights[row * k + j]
                  << ", want " << want.weights[j];
          }
        }
      }
    }
  }
}
// --------------------------------------------------------------- sums ----

TEST(RoutingSums, RenormalizedWeightsSumToOneOrScale) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int t = 256, e = 64, k = 8;
  const std::vector<float> x = test::random_vector(static_cast<std::size_t>(t) * e, rng, -6, 6);
  const std::vector<float> bias = test::random_vector(e, rng, -1, 1);
  const std::pair<RoutingConfig, double> cases[] = {
      {make_config(P::Renormalize, e, k), 1.0},
      {make_config(P::RenormalizeNaive, e, k), 1.0},
      {make_config(P::SigmoidRenorm, e, k), 1.0},
      {make_config(P::DeepSeekV3, e, k, 8, 3, 2.5f, true), 2.5},
      {make_config(P::MiniMax2, e, k, 1, 1, 1.7f, false), 1.7f}};
  for (const auto& [c, want] : cases) {
    SCOPED_TRACE(to_string(c.policy));
    const Routing r = route(c, x.data(), t, c.has_bias ? bias.data() : nullptr);
    for (int row = 0; row < t; ++row) {
      const std::vector<float> w = row_of(r.weights, row, k);
      const double sum = std::accumulate(w.begin(), w.end(), 0.0);
      ASSERT_NEAR(sum, want, test::kRoutingRelTol * want) << "token " << row;
    }
  }
}

// --------------------------------------------------------------- size ----

TEST(RoutingScale, DeepSeekSizedBatchIsFast) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("UNIMOE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int t = 16384, e = 256, k = 8;
  const std::vector<float> x = test::random_vector(static_cast<std::size_t>(t) * e, rng, -4, 4);
  const std::vector<float> bias = test::random_vector(e, rng, -0.1f, 0.1f);
  const RoutingConfig c = make_config(P::DeepSeekV3, e, k, 8, 4, 2.5f, true);
  const auto start = std::chrono::steady_clock::now();
  const Routing r = route(c, x.data(), t, bias.data());
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
#ifdef NDEBUG  // optimized builds only: debug and sanitizer builds are 10-20x slower
  EXPECT_LT(seconds.count(), 1.0);  // typically ~0.1 s
#endif
  for (int row = 0; row < t; ++row) {
    std::set<int> groups;
    const std::vector<int32_t> row_ids = row_of(r.ids, row, k);
    const std::set<int32_t> ids(row_ids.begin(), row_ids.end());
    ASSERT_EQ(ids.size(), static_cast<std::size_t>(k)) << "token " << row;
    for (int32_t id : ids) {
      ASSERT_TRUE(id >= 0 && id < e);
      groups.insert(id / (e / 8));
    }
    ASSERT_LE(groups.size(), 4u) << "token " << row;
  }
}

}  // namespace
}  // namespace unimoe::ref
