// The fuzzer's cases (tools/bench/support/fuzz_cases.h): valid, servable,
// reproducible from their id, covering every dimension the GPU fuzzer
// claims; and the planning slice of a run passes (the CPU part of
// `unimoe-bench --fuzz`, run on every test run).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "common/expect_error.h"
#include "plan/layer_plan.h"
#include "support/fuzz_cases.h"

namespace unimoe::bench {
namespace {

constexpr uint64_t kSeed = 1;  // unimoe-bench --fuzz's default seed
constexpr int kLayers = 400;   // 3,200 cases

TEST(FuzzCases, PlanningSliceOfTheDefaultSeedPasses) {
  const FuzzPlanSummary s = run_fuzz_planning(kSeed, 0, kLayers);
  EXPECT_EQ(s.cases, kLayers * kFuzzCallsPerLayer);
  for (const FuzzPlanFailure& f : s.failures) ADD_FAILURE() << f.id << ": " << f.what;
}

TEST(FuzzCases, ASeedOtherThanTheDefaultPassesToo) {
  const FuzzPlanSummary s = run_fuzz_planning(0xfeedf00d, 1000, 100);
  EXPECT_EQ(s.cases, 100 * kFuzzCallsPerLayer);
  for (const FuzzPlanFailure& f : s.failures) ADD_FAILURE() << f.id << ": " << f.what;
}

TEST(FuzzCases, EveryDimensionIsCovered) {
  std::map<std::string, std::set<std::string>> seen;
  int hostile_ids[kHostileIdKinds] = {};
  int nan_tokens = 0, ep = 0, expert_bias = 0, max_t_calls = 0;
  std::map<Gemm2Mode, int> gemm2_calls;  // calls per GEMM2 mode the layer's override gives
  int folded_calls = 0, quantizing_calls = 0;  // calls the layer's decode folds change
  for (int l = 0; l < kLayers; ++l) {
    const FuzzLayer layer = fuzz_layer(kSeed, l);
    const MoEConfig& c = layer.config;
    seen["policy"].insert(to_string(c.routing.policy));
    seen["activation"].insert(to_string(c.experts.activation));
    seen["logits_type"].insert(to_string(c.routing.logits_type));
    seen["backend"].insert(c.options.backend);
    seen["variant"].insert(c.options.routing_variant);
    seen["gemm2_path"].insert(layer.gemm2_path);
    const DevOverrides dev = fuzz_dev_overrides(layer, DevOverrides{});
    if (c.routing.n_group > 1) seen["groups"].insert("grouped");
    if (c.routing.has_bias) seen["routing_bias"].insert("yes");
    ep += c.local_experts() < c.routing.num_experts;
    if (layer.ep_world > 0) {
      seen["ep_world"].insert(std::to_string(layer.ep_world));
      // What EPLayer takes: the whole expert range, E a multiple of W, no
      // FP8PerTensor (static scales only there).
      EXPECT_EQ(c.local_experts(), c.routing.num_experts);
      EXPECT_EQ(c.routing.num_experts % layer.ep_world, 0);
      EXPECT_NE(c.experts.quant, QuantVariant::FP8PerTensor);
      for (int k = 0; k < kFuzzCallsPerLayer; ++k) {
        const FuzzCall call = fuzz_call(layer, k);
        EXPECT_EQ(fuzz_ep_tokens(layer, call, 0), call.num_tokens);
        for (int r = 1; r < layer.ep_world; ++r) {
          const int t = fuzz_ep_tokens(layer, call, r);
          EXPECT_GE(t, 0);
          EXPECT_LE(t, layer.max_tokens);
        }
      }
    }
    expert_bias += c.experts.has_bias;
    seen["shared_scratch"].insert(layer.shared_scratch ? "shared" : "own");
    if (c.experts.quant == QuantVariant::FP8PerTensor)
      seen["static_scales"].insert(layer.static_scales ? "static" : "dynamic");
    else
      EXPECT_FALSE(layer.static_scales);
    for (int k = 0; k < kFuzzCallsPerLayer; ++k) {
      const FuzzCall call = fuzz_call(layer, k);
      seen["logits"].insert(to_string(call.logits));
      seen["routing"].insert(to_string(call.routing));
      if (call.num_tokens > 0) {
        const ExpertsPath path = plan_for_tokens(c, call.num_tokens).path;
        gemm2_calls[gemm2_mode_for(c, call.num_tokens, path, dev)]++;
        const LayerPlan plan = plan_layer(c, call.num_tokens, false, RoutingDeviceCaps{}, dev);
        EXPECT_TRUE(layer.decode_folds || !plan.finalize_in_gemm2);
        folded_calls += plan.finalize_in_gemm2;
        quantizing_calls += plan.fp8_quant_in_gemm;
      }
      if (call.num_tokens == 0) seen["T"].insert("0");
      if (call.num_tokens == 1) seen["T"].insert("1");
      if (call.num_tokens > 1 && call.num_tokens % 2 == 1) seen["T"].insert("odd");
      max_t_calls += call.num_tokens == layer.max_tokens && layer.max_tokens > 1;
      if (call.routing == FuzzRouting::PrecomputedHostile) {
        const FuzzPrecomputed p = fuzz_precomputed(layer, call);
        for (int i = 0; i < kHostileIdKinds; ++i) hostile_ids[i] += p.hostile_ids[i];
        nan_tokens += p.nan_token >= 0;
      }
    }
  }
  EXPECT_EQ(seen["policy"].size(), 10u);
  EXPECT_EQ(seen["activation"].size(), 4u);
  EXPECT_EQ(seen["logits_type"].size(), 2u);
  EXPECT_EQ(seen["backend"], (std::set<std::string>{"auto", "mma", "cutlass", "stream"}));
  EXPECT_EQ(seen["variant"], (std::set<std::string>{"auto", "split", "fused", "cluster"}));
  EXPECT_EQ(seen["gemm2_path"], (std::set<std::string>{"auto", "combine", "gate"}));
  EXPECT_GT(gemm2_calls[Gemm2Mode::Gate], 50);
  EXPECT_GT(gemm2_calls[Gemm2Mode::Combine], 20);
  EXPECT_GT(folded_calls, 20);
  EXPECT_GT(quantizing_calls, 5);
  // A layer's own override yields to one the caller sets (the environment's).
  DevOverrides expert;
  expert.set("gemm2_path=expert");
  for (int l = 0; l < 8; ++l)
    EXPECT_EQ(fuzz_dev_overrides(fuzz_layer(kSeed, l), expert).gemm2_path, DevGemm2Path::kExpert);
  EXPECT_EQ(seen["groups"].size(), 1u);
  EXPECT_EQ(seen["routing_bias"].size(), 1u);
  EXPECT_EQ(seen["logits"].size(), 4u);
  EXPECT_EQ(seen["routing"].size(), 3u);
  EXPECT_EQ(seen["T"].size(), 3u);
  EXPECT_GT(max_t_calls, 50);
  EXPECT_GT(ep, 20);
  EXPECT_EQ(seen["ep_world"], (std::set<std::string>{"2", "3", "4", "8"}));
  EXPECT_EQ(seen["static_scales"], (std::set<std::string>{"static", "dynamic"}));
  EXPECT_EQ(seen["shared_scratch"], (std::set<std::string>{"shared", "own"}));
  EXPECT_GT(expert_bias, 20);
  EXPECT_GT(nan_tokens, 20);
  for (int i = 0; i < kHostileIdKinds; ++i) EXPECT_GT(hostile_ids[i], 20) << "hostile id kind " << i;
}

TEST(FuzzCases, ACaseIsAPureFunctionOfItsId) {
  for (int l : {0, 7, 123}) {
    for (int k : {0, 5}) {
      const FuzzLayer a = fuzz_layer(kSeed, l), b = fuzz_layer(kSeed, l);
      EXPECT_EQ(describe(a, fuzz_call(a, k)), describe(b, fuzz_call(b, k)));
      const std::vector<float> x = fuzz_logits(a, fuzz_call(a, k)), y = fuzz_logits(b, fuzz_call(b, k));
      ASSERT_EQ(x.size(), y.size());
      for (std::size_t i = 0; i < x.size(); ++i)
        EXPECT_TRUE(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]))) << i;
    }
  }
  EXPECT_NE(describe(fuzz_layer(kSeed, 1), fuzz_call(fuzz_layer(kSeed, 1), 0)),
            describe(fuzz_layer(kSeed, 2), fuzz_call(fuzz_layer(kSeed, 2), 0)));
}

TEST(FuzzCases, CaseIdsRoundTripAndBadOnesAreRefused) {
  uint64_t seed = 0;
  int layer = 0, call = 0;
  parse_case_id(case_id(18446744073709551615ull, 1249, 7), seed, layer, call);
  EXPECT_EQ(seed, 18446744073709551615ull);
  EXPECT_EQ(layer, 1249);
  EXPECT_EQ(call, 7);
  for (const char* bad : {"", "1:2", "1:2:8", "1:-2:3", "x:1:1", "1:1:1:1", "1:1:1x"})
    EXPECT_EQ(test::error_of([&] { parse_case_id(bad, seed, layer, call); }).field(), "fuzz-case") << bad;
}

TEST(FuzzCases, AdversarialRowsAndCheckedTokens) {
  int adversarial_calls = 0;
  for (int l = 0; l < 100; ++l) {
    const FuzzLayer layer = fuzz_layer(kSeed, l);
    for (int k = 0; k < kFuzzCallsPerLayer; ++k) {
      const FuzzCall call = fuzz_call(layer, k);
      const std::vector<int> check = fuzz_check_tokens(layer, call);
      const int t = call.num_tokens;
      if (t == 0) {
        EXPECT_TRUE(check.empty());
        continue;
      }
      EXPECT_EQ(check.front(), 0);
      EXPECT_EQ(check.back(), t - 1);
      for (std::size_t i = 1; i < check.size(); ++i) EXPECT_LT(check[i - 1], check[i]);
      if (call.logits != FuzzLogits::Adversarial) continue;
      ++adversarial_calls;
      EXPECT_TRUE(is_adversarial_row(layer, call, t / 2));
      if (call.routing == FuzzRouting::Logits)
        EXPECT_NE(std::find(check.begin(), check.end(), t / 2), check.end()) << "the adversarial row is checked";
    }
  }
  EXPECT_GT(adversarial_calls, 50);
}

}  // namespace
}  // namespace unimoe::bench
