// Hostile inputs through the whole layer against the CPU reference
// (docs/design.md, "Inputs outside the usual range"): router logits without
// a valid score, infinities and huge values under each policy family, fp32
// and bf16 logits, every routing variant; precomputed routing with ids
// outside [0, E), repeated ids and negative, NaN and inf weights on every
// backend, with and without an expert-parallel range; NaN in one token's x
// and in one expert's weights; CUDA-graph capture replayed on such inputs.
//
// Metric: test::matches_reference (gpu/hostile_layer_rig.h): token by
// token, non-finite exactly where the reference is, elsewhere relative L2
// error below test::kLayerTolerance. Each call runs twice, its output
// poisoned first with 0xff (NaN) and then with 0x7f (a finite 3.4e38), so
// that a row left unwritten fails whether its reference is finite or not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "gpu/hostile_layer_rig.h"
#include "gpu/layer_rig.h"
#include "ref/ref.h"
#include "ref/synthetic.h"
#include "support/presets.h"

namespace unimoe {
namespace {

using test::HostileLayerRig;
constexpr double kTolerance = test::kLayerTolerance;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kPoisonBytes[] = {0xff, 0x7f};
constexpr const char* kBackends[] = {"mma", "cutlass", "stream"};
constexpr const char* kAllVariants[] = {"split", "fused", "cluster", "auto"};
constexpr int kHidden = 256, kInter = 128;

// Runs the call once per poison byte, each time checked against `want`.
void expect_call_matches(HostileLayerRig& rig, const ForwardArgs& a, const std::vector<float>& want) {
  for (const int byte : kPoisonBytes) {
    SCOPED_TRACE("output poisoned with " + std::to_string(byte));
    rig.poison_output(byte);
    rig.layer().forward(a, nullptr);
    EXPECT_TRUE(test::matches_reference(rig.output(a.num_tokens), want, kHidden, kTolerance));
  }
}

// ------------------------------------------------------------- logits ----

// Rows of router logits: without a valid score, with +-inf, with huge
// magnitudes, with ties; the rest N(0, 1).
enum RowKind {
  kNormal, kAllNaN, kOneNaN, kAllNegInf, kAllEqual, kOnePosInf, kTwoPosInf,
  kHalfNegInf, kHuge, kOneFinite, kMixed,
};
constexpr RowKind kAllKinds[] = {kAllNaN,    kOneNaN,     kAllNegInf, kAllEqual,
                                 kOnePosInf, kTwoPosInf,  kHalfNegInf, kHuge,
                                 kOneFinite, kMixed};
// TopK passes its chosen logits on as weights, so it gets the rows whose
// chosen logits are finite and moderate (E/2 >= K).
constexpr RowKind kFiniteChoiceKinds[] = {kOneNaN, kAllEqual, kHalfNegInf};

void fill_row(RowKind kind, int num_experts, std::mt19937_64& rng, float* row) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> pick(0, num_experts - 1);
  for (int e = 0; e < num_experts; ++e) row[e] = normal(rng);
  float* end = row + num_experts;
  switch (kind) {
    case kNormal: break;
    case kAllNaN: std::fill(row, end, kNaN); break;
    case kOneNaN: row[pick(rng)] = kNaN; break;
    case kAllNegInf: std::fill(row, end, -kInf); break;
    case kAllEqual: std::fill(row, end, 1.5f); break;
    case kOnePosInf: row[pick(rng)] = kInf; break;
    case kTwoPosInf: {
      const int a = pick(rng);
      row[a] = row[(a + 1 + pick(rng) % (num_experts - 1)) % num_experts] = kInf;
      break;
    }
    case kHalfNegInf:
      for (int e = 0; e < num_experts; e += 2) row[e] = -kInf;
      break;
    case kHuge:
      for (int e = 0; e < num_experts; ++e) row[e] = pick(rng) % 2 ? 3e38f : -3e38f;
      break;
    case kOneFinite: {
      const float v = row[0];
      std::fill(row, end, kNaN);
      row[pick(rng)] = v;
      break;
    }
    case kMixed:
      for (int e = 1; e < num_experts; e += 4) row[e] = kNaN;
      for (int e = 2; e < num_experts; e += 4) row[e] = -kInf;
      row[pick(rng)] = kInf;
      break;
  }
}

// [T, E] logits: odd tokens hostile (cycling through the kinds), even
// tokens ordinary, so that every hostile row has ordinary neighbours.
std::vector<float> hostile_logits(const MoEConfig& c, int t, uint64_t seed) {
  const bool topk = c.routing.policy == RoutingPolicy::TopK;
  const RowKind* kinds = topk ? kFiniteChoiceKinds : kAllKinds;
  const int count = topk ? std::size(kFiniteChoiceKinds) : std::size(kAllKinds);
  const int e = c.routing.num_experts;
  std::mt19937_64 rng(seed);
  std::vector<float> logits(std::size_t(t) * e);
  for (int r = 0; r < t; ++r)
    fill_row(r % 2 ? kinds[(r / 2) % count] : kNormal, e, rng, &logits[std::size_t(r) * e]);
  return logits;
}

// One config of each policy family; the DeepSeek ones grouped, with a bias.
std::vector<MoEConfig> policy_configs() {
  auto deepseek = [](int e, int k, int groups, int kept) {
    MoEConfig c = moe_config(RoutingPolicy::DeepSeekV3, e, k, kHidden, kInter);
    c.routing.n_group = groups;
    c.routing.topk_group = kept;
    c.routing.has_bias = true;
    c.routing.routed_scaling_factor = 2.5f;
    return c;
  };
  return {moe_config(RoutingPolicy::Renormalize, 32, 4, kHidden, kInter),
          moe_config(RoutingPolicy::Renormalize, 128, 8, kHidden, kInter),
          moe_config(RoutingPolicy::Default, 32, 4, kHidden, kInter),
          moe_config(RoutingPolicy::Sigmoid, 32, 4, kHidden, kInter),
          deepseek(32, 4, 4, 2),
          deepseek(256, 8, 8, 4),
          moe_config(RoutingPolicy::Llama4, 16, 1, kHidden, kInter),
          moe_config(RoutingPolicy::TopK, 32, 4, kHidden, kInter)};
}

// Fused and cluster serve T*K <= 4096, so every variant runs at these T.
constexpr int kLogitTokens[] = {7, 29, 300};

TEST(HostileInputsGpu, LogitsWithoutAValidScoreUnderEveryPolicyAndVariant) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  for (MoEConfig c : policy_configs()) {
    for (LogitsType type : {LogitsType::F32, LogitsType::BF16}) {
      c.routing.logits_type = type;
      std::map<int, std::vector<float>> want;  // by T: one reference for every variant
      for (const char* variant : kAllVariants) {
        c.options.routing_variant = variant;
        SCOPED_TRACE(c.to_string() + " seed " + std::to_string(seed));
        HostileLayerRig rig(c, kLogitTokens[std::size(kLogitTokens) - 1], seed);
        for (const int t : kLogitTokens) {
          SCOPED_TRACE("T=" + std::to_string(t));
          rig.load_x(t, seed ^ 0xabc);
          const std::vector<float> read = rig.load_logits(hostile_logits(c, t, seed + t));
          if (!want.count(t)) want[t] = rig.reference(rig.route(t, read));
          expect_call_matches(rig, rig.args(t), want[t]);
        }
      }
    }
  }
}

// ------------------------------------------------------ precomputed ----

constexpr int32_t kIntMin = std::numeric_limits<int32_t>::min();
constexpr int32_t kIntMax = std::numeric_limits<int32_t>::max();

// Precomputed routing of T tokens: each id a valid one (local to this rank
// or not), an id outside [0, E), or a repeat of the token's previous id;
// weights in [-1, 1]. Tokens 0-4 (where T has them): no valid id; `local`
// K times; a NaN weight on `local`; a NaN weight on INT_MIN (no effect);
// an inf weight on `local`.
ref::Routing hostile_routing(int t, int e, int k, int32_t local, std::mt19937_64& rng) {
  const int32_t bad[] = {-1, e, e + 7, kIntMax, kIntMin};
  std::uniform_int_distribution<int> valid(0, e - 1), draw(0, 9), which(0, 4);
  std::uniform_real_distribution<float> weight(-1.0f, 1.0f);
  ref::Routing r;
  r.num_tokens = t;
  r.top_k = k;
  for (int i = 0; i < t * k; ++i) {
    const int d = draw(rng);
    r.ids.push_back(d < 6 ? valid(rng) : d < 9 || i % k == 0 ? bad[which(rng)] : r.ids.back());
    r.weights.push_back(weight(rng));
  }
  auto token = [&](int n) { return r.ids.begin() + n * k; };
  if (t > 0) std::fill(token(0), token(1), bad[which(rng)]);
  if (t > 1) std::fill(token(1), token(2), local);
  auto set = [&](int n, int32_t id, float w) {
    if (n >= t) return;
    r.ids[n * k] = id;
    r.weights[n * k] = w;
  };
  set(2, local, kNaN);
  set(3, kIntMin, kNaN);
  set(4, local, kInf);
  return r;
}

// Rows T*K: 20 (the block's short path), 52 (the sorted pair), 160 (the
// general path; the split chain's one-kernel count and scan) and 2800 (the
// split chain's count, scan and scatter).
constexpr int kRoutedTokens[] = {5, 13, 40, 700};

TEST(HostileInputsGpu, PrecomputedIdsOutOfRangeRepeatedAndOddWeights) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 16, 4, kHidden, kInter);
  c.experts.has_bias = true;  // the cutlass path's finalize reads the ids for b2
  for (const bool expert_parallel : {false, true}) {
    c.experts.local_expert_offset = expert_parallel ? 4 : 0;
    c.experts.num_local_experts = expert_parallel ? 8 : -1;
    std::map<int, std::pair<ref::Routing, std::vector<float>>> cases;  // by T
    for (const char* backend : kBackends) {
      for (const char* variant : {"split", "fused"}) {
        c.options.backend = backend;
        c.options.routing_variant = variant;
        SCOPED_TRACE(c.to_string() + " seed " + std::to_string(seed));
        HostileLayerRig rig(c, kRoutedTokens[std::size(kRoutedTokens) - 1], seed);
        for (const int t : kRoutedTokens) {
          SCOPED_TRACE("T=" + std::to_string(t));
          rig.load_x(t, seed ^ 0xabc);
          if (!cases.count(t)) {
            std::mt19937_64 rng(seed + t);
            const ref::Routing r = hostile_routing(t, 16, 4, c.experts.local_expert_offset, rng);
            cases[t] = {r, rig.reference(r)};
          }
          rig.load_routing(cases[t].first);
          expect_call_matches(rig, rig.args(t, true), cases[t].second);
        }
      }
    }
    // The reference itself, for the special tokens: zeros without a valid
    // id, NaN under a NaN weight on a local id, finite under one on INT_MIN.
    const std::vector<float>& want = cases[5].second;
    EXPECT_TRUE(std::all_of(want.begin(), want.begin() + kHidden, [](float v) { return v == 0; }));
    EXPECT_TRUE(std::all_of(want.begin() + 2 * kHidden, want.begin() + 3 * kHidden,
                            [](float v) { return std::isnan(v); }));
    EXPECT_TRUE(std::all_of(want.begin() + 3 * kHidden, want.begin() + 4 * kHidden,
                            [](float v) { return std::isfinite(v); }));
  }
}

// ------------------------------------------------- x and the weights ----

// Tokens that the reference routes to `expert` (global id).
std::vector<bool> routed_to(const ref::Routing& r, int expert) {
  std::vector<bool> hit(r.num_tokens, false);
  for (int i = 0; i < r.num_tokens * r.top_k; ++i)
    if (r.ids[i] == expert) hit[i / r.top_k] = true;
  return hit;
}

TEST(HostileInputsGpu, NaNInOneExpertsWeightsReachesOnlyItsTokens) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 8, 2, kHidden, kInter);
  const int t = 40, e = 8;
  constexpr int kGateExpert = 6, kDownExpert = 3, kColumn = 17;
  std::vector<float> logits = ref::make_logits(c, t, seed, "uniform");
  logits[0 * e + kDownExpert] += 100.0f;  // each spoiled expert has tokens
  logits[1 * e + kGateExpert] += 100.0f;
  for (const char* backend : kBackends) {
    c.options.backend = backend;
    SCOPED_TRACE(c.to_string() + " seed " + std::to_string(seed));
    HostileLayerRig rig(c, t, seed);
    rig.load_x(t, seed ^ 0xabc);
    const ref::Routing r = rig.route(t, rig.load_logits(logits));
    rig.spoil_w13(kGateExpert, 9, 100);           // a gate row: every column of its tokens
    rig.spoil_w2(kDownExpert, kColumn, 5);        // row 17 of w2: column 17 of its tokens
    const std::vector<float> want = rig.reference(r);
    const std::vector<bool> gate = routed_to(r, kGateExpert), down = routed_to(r, kDownExpert);
    for (int token = 0; token < t; ++token)
      for (int h = 0; h < kHidden; ++h)
        ASSERT_EQ(std::isfinite(want[token * kHidden + h]), !gate[token] && !(down[token] && h == kColumn))
            << "reference, token " << token << " column " << h;
    expect_call_matches(rig, rig.args(t), want);
  }
}

TEST(HostileInputsGpu, NaNInOneTokensXReachesOnlyThatToken) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 8, 2, kHidden, kInter);
  const int t = 40, spoiled = 11;
  const std::vector<float> logits = ref::make_logits(c, t, seed, "uniform");
  for (const char* backend : kBackends) {
    c.options.backend = backend;
    SCOPED_TRACE(c.to_string() + " seed " + std::to_string(seed));
    HostileLayerRig rig(c, t, seed);
    rig.load_x(t, seed ^ 0xabc);
    rig.spoil_x(spoiled, 3);
    const std::vector<float> want = rig.reference(rig.route(t, rig.load_logits(logits)));
    for (int token = 0; token < t; ++token)
      ASSERT_EQ(std::isfinite(want[token * kHidden]), token != spoiled) << "reference, token " << token;
    expect_call_matches(rig, rig.args(t), want);
  }
}

// ---------------------------------------------------------- graphs ----

TEST(HostileInputsGpu, CapturedOnceReplaysOnHostileInputs) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 32, 4, kHidden, kInter);
  c.experts.has_bias = true;
  const int t = 29;
  HostileLayerRig rig(c, t, seed);
  rig.load_x(t, seed ^ 0xabc);
  for (const bool precomputed : {false, true}) {
    SCOPED_TRACE(precomputed ? "precomputed routing" : "logits");
    test::CapturedForward graph(rig.layer(), rig.args(t, precomputed));
    for (int replay = 0; replay < 2; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      std::mt19937_64 rng(seed + replay);
      const ref::Routing r = precomputed
                                 ? hostile_routing(t, 32, 4, 0, rng)
                                 : rig.route(t, rig.load_logits(hostile_logits(c, t, seed + replay)));
      if (precomputed) rig.load_routing(r);
      const std::vector<float> want = rig.reference(r);
      for (const int byte : kPoisonBytes) {
        rig.poison_output(byte);
        graph.replay();
        EXPECT_TRUE(test::matches_reference(rig.output(t), want, kHidden, kTolerance)) << "poison " << byte;
      }
    }
  }
}

}  // namespace
}  // namespace unimoe
