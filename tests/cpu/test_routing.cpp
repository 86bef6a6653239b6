// Tests of the reference routing against the rules of docs/routing.md:
// hand-computed cases for every policy; ties, NaN, infinities, huge
// magnitudes and DeepSeek group masking; refused arguments. Random inputs
// against a brute force: test_routing_brute_force.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "common/routing_cases.h"
#include "core/exact_quotient.h"
#include "core/group_index.h"
#include "ref/ref.h"

namespace unimoe::ref {
namespace {

using P = RoutingPolicy;
using test::kAllPolicies;
using test::kInf;
using test::kNaN;
using test::is_deepseek;
using test::make_config;
using test::weight_matches;


// One token: exact ids, weights within 1e-6 relative.
void expect_route(const RoutingConfig& c, const std::vector<float>& x,
                  const std::vector<int32_t>& ids, const std::vector<double>& weights,
                  const std::vector<float>& bias = {}) {
  SCOPED_TRACE(to_string(c.policy));
  const Routing r = route(c, x.data(), 1, bias.empty() ? nullptr : bias.data());
  ASSERT_EQ(r.num_tokens, 1);
  ASSERT_EQ(r.top_k, c.top_k);
  EXPECT_EQ(r.ids, ids);
  ASSERT_EQ(r.weights.size(), weights.size());
  for (std::size_t j = 0; j < weights.size(); ++j)
    EXPECT_TRUE(weight_matches(r.weights[j], weights[j]))
        << "slot " << j << ": got " << r.weights[j] << ", want " << weights[j];
}

// ------------------------------------------------------------ by hand ----
// Decimal values come from the formula table, worked out once by hand.

TEST(RoutingHand, Default) {
  // p = exp([1,3,2,0]) / (e + e^3 + e^2 + 1).
  expect_route(make_config(P::Default, 4, 2), {1, 3, 2, 0}, {1, 2},
               {0.6439142598879724, 0.23688281808991016});
}

TEST(RoutingHand, RenormalizeTieGoesToLowerIndex) {
  // x[2] == x[3]; weights softmax([2, 2, 1]).
  expect_route(make_config(P::Renormalize, 5, 3), {0.5f, -1, 2, 2, 1}, {2, 3, 4},
               {0.42231879825151813, 0.42231879825151813, 0.1553624034969636});
}

TEST(RoutingHand, RenormalizeNaive) {
  expect_route(make_config(P::RenormalizeNaive, 6, 2), {0, 1, -1, 1.5f, 0.2f, 0.3f}, {3, 1},
               {0.6224593312018545, 0.3775406687981454});
}

TEST(RoutingHand, TopK) {
  expect_route(make_config(P::TopK, 4, 3), {-2, 0.5f, -0.25f, 4}, {3, 1, 2}, {4, 0.5, -0.25});
}

TEST(RoutingHand, Sigmoid) {
  expect_route(make_config(P::Sigmoid, 8, 3), {0.3f, -1.2f, 2.5f, 0, -3, 1.1f, 2.5f, -0.7f},
               {2, 6, 5}, {0.9241418199787566, 0.9241418199787566, 0.7502601055951177});
}

TEST(RoutingHand, SigmoidRenorm) {
  // sigmoid(ln 3) = 3/4, sigmoid(0) = 1/2: weights 0.75 / 1.25 and 0.5 / 1.25.
  expect_route(make_config(P::SigmoidRenorm, 4, 2), {0, 1.0986122886681098f, -1, -2}, {1, 0},
               {0.6, 0.4});
}

TEST(RoutingHand, TopKSigmoid) {
  // sigmoid(ln 4) = 4/5, sigmoid(ln 3) = 3/4.
  expect_route(make_config(P::TopKSigmoid, 5, 2),
               {1.0986122886681098f, -5, 1.3862943611198906f, 0, -0.5f}, {2, 0}, {0.8, 0.75});
}

TEST(RoutingHand, Llama4) {
  expect_route(make_config(P::Llama4, 4, 1), {0.1f, -0.3f, 0.7f, 0.7f}, {2}, {0.6681877721681662});
}

TEST(RoutingHand, DeepSeekV3BestExpertInLosingGroup) {
  // s = sigmoid([3,-3 | 1,1 | .5,.5 | -1,2]); group scores (top-2 sums)
  // 1.0, 1.46, 1.24, 1.15: groups 1 and 2 stay, so expert 0 (the best s) is out.
  // Weights 2.5 * [s(1), s(1), s(.5)] / (2 s(1) + s(.5)).
  expect_route(make_config(P::DeepSeekV3, 8, 3, 4, 2, 2.5f), {3, -3, 1, 1, 0.5f, 0.5f, -1, 2},
               {2, 3, 4}, {0.8767471266662746, 0.8767471266662746, 0.7465057466674506});
}

TEST(RoutingHand, DeepSeekV3BiasSelectsWeightsIgnoreIt) {
  // c = s + bias = [.88, .73, 1.27, .5]; weights [s(-1), s(2)] / (s(-1) + s(2)).
  expect_route(make_config(P::DeepSeekV3, 4, 2, 1, 1, 1.0f, true), {2, 1, -1, 0}, {2, 0},
               {0.2339152959760298, 0.7660847040239702}, {0, 0, 1, 0});
}

TEST(RoutingHand, MiniMax2) {
  // c = [.831, .681, .622, .850, .269, .453]: ids 3, 0, 1.
  expect_route(make_config(P::MiniMax2, 6, 3, 1, 1, 2.0f, true), {1, 2, 0.5f, 0.2f, -1, 3},
               {3, 0, 1}, {0.508707617964788, 0.6763769973216854, 0.8149153847135268},
               {0.1f, -0.2f, 0, 0.3f, 0, -0.5f});
}

// -------------------------------------------------------- adversarial ----

RoutingConfig small_config(P policy, int e, int k) {
  return make_config(policy, e, policy == P::Llama4 ? 1 : k);
}

TEST(RoutingEdge, AllEqualPicksLowestIndices) {
  for (P policy : kAllPolicies) {
    const RoutingConfig c = small_config(policy, 8, 3);
    SCOPED_TRACE(to_string(policy));
    const std::vector<float> x(8, 0.5f);
    const Routing r = route(c, x.data(), 1, nullptr);
    std::vector<int32_t> want(c.top_k);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(r.ids, want);
    for (float w : r.weights) EXPECT_EQ(w, r.weights[0]);
  }
  // Equal groups too: groups 0 and 1 stay.
  const std::vector<float> x(8, 0.0f);
  expect_route(make_config(P::DeepSeekV3, 8, 4, 4, 2), x, {0, 1, 2, 3}, {0.25, 0.25, 0.25, 0.25});
}

TEST(RoutingEdge, SignedZerosTie) {
  // -0 == +0 as floats, so they tie and the lower index wins either way round.
  expect_route(make_config(P::TopK, 3, 2), {-0.0f, 0.0f, -1}, {0, 1}, {0, 0});
  expect_route(make_config(P::TopK, 3, 2), {0.0f, -0.0f, -1}, {0, 1}, {0, 0});
  expect_route(make_config(P::Sigmoid, 2, 1), {-0.0f, 0.0f}, {0}, {0.5});
}

TEST(RoutingEdge, NaNNeverBeatsANumber) {
  const std::vector<float> x = {kNaN, 1, kNaN, -2, kNaN, 0};
  for (P policy : kAllPolicies) {
    const RoutingConfig c = small_config(policy, 6, 3);
    SCOPED_TRACE(to_string(policy));
    const Routing r = route(c, x.data(), 1, nullptr);
    const std::vector<int32_t> want = {1, 5, 3};
    EXPECT_EQ(r.ids, std::vector<int32_t>(want.begin(), want.begin() + c.top_k));
    for (float w : r.weights) EXPECT_TRUE(std::isfinite(w)) << w;
  }
}

TEST(RoutingEdge, FewerFiniteLogitsThanK) {
  // NaN and -inf tie as -inf: the lower index fills the slot first.
  const std::vector<float> x = {kNaN, -kInf, kNaN, 1};
  const std::vector<int32_t> ids = {3, 0, 1};
  const double s1 = 0.7310585786300049;
  expect_route(make_config(P::Default, 4, 3), x, ids, {1, 0, 0});
  expect_route(make_config(P::Renormalize, 4, 3), x, ids, {1, 0, 0});
  expect_route(make_config(P::RenormalizeNaive, 4, 3), x, ids, {1, 0, 0});
  expect_route(make_config(P::TopK, 4, 3), x, ids, {1, -kInf, -kInf});
  expect_route(make_config(P::Sigmoid, 4, 3), x, ids, {s1, 0, 0});
  expect_route(make_config(P::SigmoidRenorm, 4, 3), x, ids, {1, 0, 0});
  expect_route(make_config(P::TopKSigmoid, 4, 3), x, ids, {s1, 0, 0});
  expect_route(make_config(P::DeepSeekV3, 4, 3, 1, 1, 3.0f), x, ids, {3, 0, 0});
}

TEST(RoutingEdge, AllLogitsNonFinite) {
  const std::vector<float> x = {-kInf, kNaN, -kInf, kNaN};
  const std::vector<int32_t> ids = {0, 1};
  expect_route(make_config(P::Default, 4, 2), x, ids, {0.25, 0.25});  // uniform over E
  expect_route(make_config(P::Renormalize, 4, 2), x, ids, {0.5, 0.5});
  expect_route(make_config(P::RenormalizeNaive, 4, 2), x, ids, {0.5, 0.5});
  expect_route(make_config(P::TopK, 4, 2), x, ids, {-kInf, -kInf});
  expect_route(make_config(P::Sigmoid, 4, 2), x, ids, {0, 0});
  expect_route(make_config(P::SigmoidRenorm, 4, 2), x, ids, {0, 0});  // zero sum stays 0
  expect_route(make_config(P::TopKSigmoid, 4, 2), x, ids, {0, 0});
  expect_route(make_config(P::Llama4, 4, 1), x, {0}, {0});
  expect_route(make_config(P::DeepSeekV3, 4, 2, 2, 1, 2.0f), x, ids, {0, 0});
  expect_route(make_config(P::MiniMax2, 4, 2), x, ids, {0, 0});
}

TEST(RoutingEdge, PlusInfinityTakesTheMass) {
  const std::vector<float> x = {1, kInf, 0, kInf, 2};
  const std::vector<int32_t> ids = {1, 3, 4};
  const double s2 = 0.8807970779778823;
  expect_route(make_config(P::Default, 5, 3), x, ids, {0.5, 0.5, 0});
  expect_route(make_config(P::Renormalize, 5, 3), x, ids, {0.5, 0.5, 0});
  expect_route(make_config(P::RenormalizeNaive, 5, 3), x, ids, {0.5, 0.5, 0});
  expect_route(make_config(P::TopK, 5, 3), x, ids, {kInf, kInf, 2});
  expect_route(make_config(P::Sigmoid, 5, 3), x, ids, {1, 1, s2});
  expect_route(make_config(P::SigmoidRenorm, 5, 3), x, ids,
               {1 / (2 + s2), 1 / (2 + s2), s2 / (2 + s2)});
  expect_route(make_config(P::Llama4, 5, 1), x, {1}, {1});
  expect_route(make_config(P::DeepSeekV3, 5, 3, 1, 1, 2.0f), x, ids,
               {2 / (2 + s2), 2 / (2 + s2), 2 * s2 / (2 + s2)});
  // Three +inf logits share p: 1/3 each under Default, 1/2 once renormalized.
  const std::vector<float> y = {kInf, 0, kInf, kInf};
  expect_route(make_config(P::Default, 4, 2), y, {0, 2}, {1.0 / 3, 1.0 / 3});
  expect_route(make_config(P::Renormalize, 4, 2), y, {0, 2}, {0.5, 0.5});
}

TEST(RoutingEdge, HugeMagnitudes) {
  const std::vector<float> x = {1e30f, -1e30f, 5, 1e31f};
  expect_route(make_config(P::Default, 4, 2), x, {3, 0}, {1, 0});
  expect_route(make_config(P::Renormalize, 4, 2), x, {3, 0}, {1, 0});
  expect_route(make_config(P::RenormalizeNaive, 4, 2), x, {3, 0}, {1, 0});
  expect_route(make_config(P::TopK, 4, 2), x, {3, 0}, {1e31f, 1e30f});
  expect_route(make_config(P::Sigmoid, 4, 2), x, {3, 0}, {1, 1});
  expect_route(make_config(P::SigmoidRenorm, 4, 2), x, {3, 0}, {0.5, 0.5});
  // fp32 s saturates: c(1e30) == c(1e31) == 1, the lower index wins.
  expect_route(make_config(P::DeepSeekV3, 4, 2), x, {0, 3}, {0.5, 0.5});
  const std::vector<float> y = {-1e30f, -1e31f, -1e30f, -1e30f};
  expect_route(make_config(P::Default, 4, 2), y, {0, 2}, {1.0 / 3, 1.0 / 3});
  expect_route(make_config(P::Renormalize, 4, 2), y, {0, 2}, {0.5, 0.5});
  expect_route(make_config(P::SigmoidRenorm, 4, 2), y, {0, 2}, {0, 0});
}

TEST(RoutingEdge, SaturatedScoresSelectOnTheLogit) {
  const std::vector<float> x = {20, 30};
  ASSERT_EQ(1.0f / (1.0f + std::exp(-20.0f)), 1.0f);  // the premise: s(20) == s(30) in fp32
  for (P policy : kAllPolicies) {
    SCOPED_TRACE(to_string(policy));
    const Routing r = route(make_config(policy, 2, 1), x.data(), 1, nullptr);
    EXPECT_EQ(r.ids[0], is_deepseek(policy) ? 0 : 1);
  }
}

TEST(RoutingEdge, DeepSeekBiasDecidesTheGroups) {
  // x = 0: s = 0.5 everywhere. c sums: group 0 1.4 (holds the best expert,
  // c = 1.4), group 1 1.6, group 2 1.4, group 3 1.5: groups 1 and 3 stay.
  const std::vector<float> x(8, 0.0f);
  const std::vector<float> bias = {0.9f, -0.5f, 0.3f, 0.3f, 0.2f, 0.2f, 0.25f, 0.25f};
  expect_route(make_config(P::DeepSeekV3, 8, 3, 4, 2, 1.5f, true), x, {2, 3, 6}, {0.5, 0.5, 0.5},
               bias);
}

TEST(RoutingEdge, DeepSeekMaskedExpertsNeverFillSlots) {
  // Group 0 wins on experts 0 and 1; its -inf keys still rank above the
  // masked experts of the other groups.
  std::vector<float> bias(16, 0.0f);
  bias[0] = bias[1] = 10;
  bias[2] = bias[3] = -kInf;
  expect_route(make_config(P::DeepSeekV3, 16, 4, 4, 1, 1.0f, true), std::vector<float>(16, 0.0f),
               {0, 1, 2, 3}, {0.25, 0.25, 0.25, 0.25}, bias);
}

TEST(RoutingEdge, DeepSeekNaNKeysAndScores) {
  // A NaN bias makes c NaN, which counts as -inf.
  expect_route(make_config(P::MiniMax2, 4, 4, 1, 1, 1.0f, true), std::vector<float>(4, 0.0f),
               {1, 2, 3, 0}, {0.25, 0.25, 0.25, 0.25}, {kNaN, 0, 0, 0});
  // Group 0's score +inf + -inf is NaN, so -inf: the tied groups 1..3 go to group 1.
  std::vector<float> bias(8, 0.0f);
  bias[0] = kInf;
  bias[1] = -kInf;
  expect_route(make_config(P::DeepSeekV3, 8, 2, 4, 1, 1.0f, true), std::vector<float>(8, 0.0f),
               {2, 3}, {0.5, 0.5}, bias);
  // Without a bias a NaN logit has c = 0 and loses; with one it can win, weight 0.
  expect_route(make_config(P::MiniMax2, 3, 2, 1, 1, 1.0f, true), {kNaN, 0, -3}, {0, 1},
               {0, 1}, {2, 0, 0});
}

TEST(RoutingArgs, RefusesUndefinedRequests) {
  const std::vector<float> x(8, 0.0f), bias(8, 0.0f);
  auto refused = [&](const RoutingConfig& c, int t, const float* b) {
    EXPECT_THROW(route(c, x.data(), t, b), std::invalid_argument) << to_string(c.policy);
  };
  refused(make_config(P::Renormalize, 4, 5), 1, nullptr);            // K > E
  refused(make_config(P::Llama4, 8, 2), 1, nullptr);                 // Llama4 is K = 1
  refused(make_config(P::Renormalize, 8, 2), 1, bias.data());        // bias without a use
  refused(make_config(P::DeepSeekV3, 8, 2, 1, 1, 1, true), 1, nullptr);  // has_bias, no bias
  refused(make_config(P::DeepSeekV3, 8, 2, 3, 1), 1, nullptr);       // 3 does not divide 8
  refused(make_config(P::DeepSeekV3, 8, 3, 4, 1), 1, nullptr);       // one group holds 2 < K
  refused(make_config(P::TopK, 8, 2), -1, nullptr);
  const Routing empty = route(make_config(P::TopK, 8, 2), nullptr, 0, nullptr);
  EXPECT_EQ(empty.num_tokens, 0);
  EXPECT_TRUE(empty.ids.empty() && empty.weights.empty());
}

// The kernels' group map (core/group_index.h) against integer division, for
// every expert index and group size the routing limits allow (E <= 1024).
TEST(GroupIndex, EqualsIntegerDivisionEverywhere) {
  long long checked = 0;
  for (int d = 1; d <= 1024; ++d) {
    const float inverse = inverse_group_size(d);
    for (int e = 0; e < 1024; ++e, ++checked)
      ASSERT_EQ(group_index(e, inverse), e / d) << "e=" << e << " d=" << d;
  }
  EXPECT_EQ(checked, 1024LL * 1024);
}

// exact_quotient (core/exact_quotient.h), the routing kernels' division
// by K and by the tile sizes, against integer division: every dividend up
// to the fused kernels' 4096 rows for every divisor up to 1024, and the
// largest dividends it claims.
TEST(ExactQuotient, EqualsIntegerDivision) {
  for (int d = 1; d <= 1024; ++d) {
    const float inverse = inverse_of(d);
    for (int n = 0; n <= 4096; ++n) ASSERT_EQ(exact_quotient(n, inverse), n / d) << n << " / " << d;
    for (int n = kExactQuotientMax - 4096; n <= kExactQuotientMax; ++n)
      ASSERT_EQ(exact_quotient(n, inverse), n / d) << n << " / " << d;
  }
  for (int d : {3, 7, 1000, 4093, 65537, 1 << 20})
    for (int n = 0; n <= kExactQuotientMax; n += 97)
      ASSERT_EQ(exact_quotient(n, inverse_of(d)), n / d) << n << " / " << d;
}

}  // namespace
}  // namespace unimoe::ref
