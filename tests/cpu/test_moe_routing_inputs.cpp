// The reference MoE forward on routing outside the usual range, as
// precomputed routing may pass it (docs/design.md, "Inputs outside the usual
// range"): an id outside [0, E) contributes nothing, a repeated id adds its
// expert's output once per entry, weights are used as given. Each case is
// compared bit for bit with a routing that states the same sum plainly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "ref/ref.h"
#include "ref/synthetic.h"

namespace unimoe::ref {
namespace {

constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
constexpr int kExperts = 8, kTopK = 3, kHidden = 32;

// E = 8, K = 3, expert biases; this rank serves [offset, offset + num_local).
MoEConfig config_for(int offset, int num_local) {
  MoEConfig c;
  c.routing.num_experts = kExperts;
  c.routing.top_k = kTopK;
  c.experts.hidden = kHidden;
  c.experts.intermediate = 24;
  c.experts.has_bias = true;
  c.experts.local_expert_offset = offset;
  c.experts.num_local_experts = num_local;
  return c;
}

// Synthetic weights and x for T tokens; forward() runs the reference.
class Layer {
 public:
  Layer(const MoEConfig& c, int num_tokens, uint64_t seed)
      : config_(c), seeds_(seeds_for(seed)), weights_(c, seeds_), x_(host_x(c, num_tokens, seeds_)) {}
  std::vector<float> forward(const std::vector<int32_t>& ids, const std::vector<float>& weights) {
    Routing r;
    r.num_tokens = static_cast<int>(ids.size()) / kTopK;
    r.top_k = kTopK;
    r.ids = ids;
    r.weights = weights;
    return moe_forward(config_, weights_.source(), x_.data(), r, 2);
  }

 private:
  MoEConfig config_;
  Seeds seeds_;
  HostWeights weights_;
  std::vector<float> x_;
};

const float* row(const std::vector<float>& out, int token) { return out.data() + token * kHidden; }

bool same_row(const std::vector<float>& a, const std::vector<float>& b, int token) {
  return std::memcmp(row(a, token), row(b, token), kHidden * sizeof(float)) == 0;
}

TEST(MoeForwardRoutingInputs, IdsOutsideTheRangeContributeNothing) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Every expert local, then a rank serving [2, 6), where INT_MIN - offset
  // would overflow a plain subtraction.
  for (const int offset : {0, 2}) {
    SCOPED_TRACE("local_expert_offset " + std::to_string(offset));
    Layer layer(config_for(offset, offset == 0 ? -1 : 4), 3, seed);
    // Token 0: -1 and E beside a valid id; token 1: nothing valid (a NaN
    // weight on INT_MIN included); token 2: E + 7 beside two valid ids.
    const std::vector<int32_t> ids = {5, -1, kExperts, kMax, kMin, kExperts + 7, 2, kExperts + 7, 3};
    const std::vector<float> weights = {0.5f, 0.7f, 0.9f, 0.3f, NAN, 0.2f, 0.6f, 0.8f, 0.4f};
    // The same sums: each out-of-range entry moved to a local expert at weight 0.
    const std::vector<int32_t> plain_ids = {5, 2, 2, 2, 2, 2, 2, 2, 3};
    const std::vector<float> plain_weights = {0.5f, 0, 0, 0, 0, 0, 0.6f, 0, 0.4f};
    const std::vector<float> got = layer.forward(ids, weights);
    const std::vector<float> want = layer.forward(plain_ids, plain_weights);
    for (int t = 0; t < 3; ++t) EXPECT_TRUE(same_row(got, want, t)) << "token " << t;
    for (int h = 0; h < kHidden; ++h) EXPECT_EQ(row(got, 1)[h], 0.0f) << "token 1 has no valid id";
  }
}

TEST(MoeForwardRoutingInputs, RepeatedIdsAddOncePerEntry) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Layer layer(config_for(0, -1), 2, seed);
  // Token 0 names expert 3 twice with weight w: exactly 2w on one entry
  // (doubling is exact); token 1 names expert 6 three times.
  const std::vector<float> got =
      layer.forward({3, 3, 5, 6, 6, 6}, {0.375f, 0.375f, 0.25f, 0.5f, 0.5f, 0.5f});
  const std::vector<float> twice = layer.forward({3, 5, 0, 6, 6, 0}, {0.75f, 0.25f, 0, 1.0f, 0.5f, 0});
  for (int t = 0; t < 2; ++t) EXPECT_TRUE(same_row(got, twice, t)) << "token " << t;
  const std::vector<float> once = layer.forward({3, 5, 0, 6, 0, 0}, {0.375f, 0.25f, 0, 0.5f, 0, 0});
  EXPECT_FALSE(same_row(got, once, 0));
}

TEST(MoeForwardRoutingInputs, WeightsAreUsedAsGiven) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Layer layer(config_for(0, -1), 3, seed);
  const std::vector<int32_t> ids = {1, 4, 7, 0, 2, 5, 3, 6, 1};
  const std::vector<float> weights = {0.5f, 0.25f, 0.125f, 0.3f, 0.4f, 0.2f, 0.6f, 0.1f, 0.3f};
  const std::vector<float> base = layer.forward(ids, weights);

  // Negated weights negate the token's output exactly.
  std::vector<float> negated = weights;
  for (int k = 0; k < kTopK; ++k) negated[k] = -negated[k];
  const std::vector<float> neg = layer.forward(ids, negated);
  for (int h = 0; h < kHidden; ++h) EXPECT_EQ(row(neg, 0)[h], -row(base, 0)[h]) << "column " << h;
  for (int t = 1; t < 3; ++t) EXPECT_TRUE(same_row(neg, base, t)) << "token " << t;

  // A NaN or inf weight on a valid id: that token's whole row is non-finite,
  // every other token keeps its bits.
  for (const float bad : {NAN, INFINITY, -INFINITY}) {
    SCOPED_TRACE("weight " + std::to_string(bad));
    std::vector<float> spoiled = weights;
    spoiled[kTopK + 1] = bad;  // token 1
    const std::vector<float> got = layer.forward(ids, spoiled);
    for (int h = 0; h < kHidden; ++h) EXPECT_FALSE(std::isfinite(row(got, 1)[h])) << "column " << h;
    EXPECT_TRUE(same_row(got, base, 0));
    EXPECT_TRUE(same_row(got, base, 2));
  }
}

}  // namespace
}  // namespace unimoe::ref
