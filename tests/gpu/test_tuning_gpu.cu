// The tuned layer on the device: every tuning candidate (path and tactics)
// computes the reference's output, a winner saved to the tuning cache is
// reused without timing, a deliberately wrong candidate is excluded by the
// reference check, and a tuned forward captures in a CUDA graph. The
// layer's own autotune: tunes the buckets asked for, saves the winners and
// serves with them (also in a graph captured afterwards), a second layer
// takes them from the cache without timing, bad options are refused.
// Metric: test::kLayerTolerance (gpu/layer_rig.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "gpu/layer_rig.h"
#include "support/presets.h"
#include "plan/tuning.h"

namespace unimoe {
namespace {

using test::kLayerTolerance;
using test::LayerRig;

TEST(TuningGpu, EveryCandidateMatchesTheReference) {
  UNIMOE_REQUIRE_GPU();
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 16, 4, 264, 136);
  for (int t : {1, 7, 100}) {
    const uint64_t seed = test::fresh_seed();
    LayerRig rig(c, t, seed);
    const int bucket = token_bucket(t);
    for (const TuningChoice& choice : candidates_for(c, bucket, current_device_arch())) {
      SCOPED_TRACE(choice.to_string() + " T=" + std::to_string(t) + " seed " + std::to_string(seed));
      const std::vector<float> logits = ref::make_logits(c, t, seed, "uniform");
      rig.load_inputs(t, seed ^ 0x77, logits);
      rig.impl().set_tuned(bucket, choice);
      rig.layer().forward(rig.args(t), nullptr);
      EXPECT_LT(rig.error(t, logits), kLayerTolerance);
    }
  }
}

TEST(TuningGpu, SavedWinnerIsReusedAndOtherDevicesAreNot) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig c = find_preset("qwen3-30b-a3b").config;
  const int t = 8;
  const std::string path = "/tmp/unimoe_tuning_gpu_test_" + std::to_string(seed) + ".json";
  const TuningDevice device = current_tuning_device();
  TuningChoice choice;  // not what the rule picks at T=8 (m16n128 on the mma path)
  choice.path = ExpertsPath::Cutlass;
  choice.sm90 = Sm90GemmTactic::Pingpong64x128;
  choice.time_us = 1;
  TuningCache cache(device);
  cache.put(TuningKey::make(device, c), token_bucket(t), choice);
  cache.save(path);

  LayerRig rig(c, t, seed);
  const std::string report = rig.layer().use_tuning_cache(path);
  EXPECT_NE(report.find("winners for 1 of 4 token buckets used"), std::string::npos) << report;
  const std::vector<float> logits = ref::make_logits(c, t, seed, "uniform");
  rig.load_inputs(t, seed, logits);
  rig.layer().forward(rig.args(t), nullptr);
  EXPECT_LT(rig.error(t, logits), kLayerTolerance);

  TuningDevice other = device;
  other.gpu_name = device.gpu_name + " (another card)";  // never this one, on any machine
  TuningCache foreign(other);
  foreign.put(TuningKey::make(other, c), token_bucket(t), choice);
  foreign.save(path);
  LayerRig fresh(c, t, seed);
  const std::string refused = fresh.layer().use_tuning_cache(path);
  EXPECT_NE(refused.find("not used"), std::string::npos) << refused;
  EXPECT_NE(refused.find("winners for 0 of 4"), std::string::npos) << refused;
  std::remove(path.c_str());
}

TEST(TuningGpu, WrongCandidateIsExcludedByTheReferenceCheck) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 32, 4, 256, 128);
  const int t = 33, bucket = token_bucket(t);
  LayerRig rig(c, t, seed);
  const std::vector<float> logits = ref::make_logits(c, t, seed, "uniform");
  const std::vector<TuningChoice> candidates = candidates_for(c, bucket, current_device_arch());
  ASSERT_GE(candidates.size(), 2u);
  const TuningChoice sabotaged = candidates.front();
  std::vector<std::string> log;
  const Tuner tuner(
      // The sabotaged candidate claims to be the fastest by far.
      [&](const TuningChoice& ch) { return ch == sabotaged ? 0.001 : 100.0; },
      [&](const TuningChoice& ch, std::string* why) {
        rig.load_inputs(t, seed, logits);
        rig.impl().set_tuned(bucket, ch);
        rig.layer().forward(rig.args(t), nullptr);
        // Sabotage: half of the output rows zeroed after a correct forward.
        if (ch == sabotaged)
          UNIMOE_CUDA_CHECK(cudaMemset(rig.args(t).out, 0, (t / 2) * c.experts.hidden * 2));
        const double err = rig.error(t, logits);
        if (err < kLayerTolerance) return true;
        *why = "error " + std::to_string(err);
        return false;
      },
      [&](const std::string& line) { log.push_back(line); });
  const TuningChoice winner = tuner.tune(candidates);
  EXPECT_NE(winner, sabotaged);
  const std::string rejection = "rejected " + sabotaged.to_string() + ": reference check failed";
  EXPECT_TRUE(std::any_of(log.begin(), log.end(),
                          [&](const std::string& line) { return line.rfind(rejection, 0) == 0; }))
      << "the rejection is reported";
}

TEST(TuningGpu, TunedForwardCapturesAndReplays) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig c = find_preset("dsv3-tp8").config;
  const int t = 5;
  LayerRig rig(c, t, seed);
  TuningChoice choice;
  choice.gemm1 = {16, 128};
  choice.gemm2 = {16, 64};
  rig.impl().set_tuned(token_bucket(t), choice);
  rig.load_inputs(t, seed, ref::make_logits(c, t, seed, "uniform"));
  test::CapturedForward graph(rig.layer(), rig.args(t));
  for (int replay = 0; replay < 2; ++replay) {
    const std::vector<float> logits = ref::make_logits(c, t, seed + 1 + replay, "uniform");
    rig.load_inputs(t, seed + 10 + replay, logits);
    graph.replay();
    EXPECT_LT(rig.error(t, logits), kLayerTolerance) << "replay " << replay;
  }
}

// Whether any line contains `part`.
bool any_contains(const std::vector<std::string>& lines, const std::string& part) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& line) { return line.find(part) != std::string::npos; });
}

TEST(TuningGpu, AutotuneTunesSavesAndServesTheBuckets) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 16, 4, 256, 128);
  const std::string path = "/tmp/unimoe_autotune_gpu_test_" + std::to_string(seed) + ".json";
  std::remove(path.c_str());
  AutotuneOptions o;
  o.tokens = {1, 33};
  o.iters = 3;
  o.cache_path = path;
  std::vector<std::string> lines;
  o.progress = [&](const std::string& line) { lines.push_back(line); };

  LayerRig rig(c, 64, seed);
  const std::string report = rig.layer().autotune(o);
  EXPECT_NE(report.find("bucket 1 (T=1): tuned: "), std::string::npos) << report;
  EXPECT_NE(report.find("bucket 64 (T=33): tuned: "), std::string::npos) << report;
  EXPECT_TRUE(any_contains(lines, "timed ")) << "candidates were timed";

  const TuningDevice device = current_tuning_device();
  const TuningCache cache = TuningCache::load(path, device);
  const TuningKey key = TuningKey::make(device, c);
  for (int t : {1, 33}) {
    SCOPED_TRACE("T=" + std::to_string(t));
    const std::optional<TuningChoice> saved = cache.find(key, token_bucket(t));
    ASSERT_TRUE(saved.has_value()) << "winner saved";
    const std::optional<TuningChoice> serving = rig.impl().tuned_choice(token_bucket(t));
    ASSERT_TRUE(serving.has_value());
    EXPECT_EQ(serving->to_string(), saved->to_string());
    EXPECT_EQ(rig.layer().describe(t).rfind("path=" + std::string(path_name(saved->path)) + " ", 0), 0u)
        << rig.layer().describe(t);
    const std::vector<float> logits = ref::make_logits(c, t, seed + t, "uniform");
    rig.load_inputs(t, seed ^ t, logits);
    rig.layer().forward(rig.args(t), nullptr);
    EXPECT_LT(rig.error(t, logits), kLayerTolerance);
  }

  // A graph captured after autotune replays the winner.
  const int t = 33;
  rig.load_inputs(t, seed, ref::make_logits(c, t, seed, "uniform"));
  test::CapturedForward graph(rig.layer(), rig.args(t));
  const std::vector<float> logits = ref::make_logits(c, t, seed + 7, "uniform");
  rig.load_inputs(t, seed + 8, logits);
  graph.replay();
  EXPECT_LT(rig.error(t, logits), kLayerTolerance) << "graph replay";

  // A second layer of the same config takes both winners from the cache.
  LayerRig again(c, 64, seed + 1);
  std::vector<std::string> again_lines;
  o.progress = [&](const std::string& line) { again_lines.push_back(line); };
  const std::string again_report = again.layer().autotune(o);
  EXPECT_NE(again_report.find("bucket 1 (T=1): cached: "), std::string::npos) << again_report;
  EXPECT_NE(again_report.find("bucket 64 (T=33): cached: "), std::string::npos) << again_report;
  EXPECT_FALSE(any_contains(again_lines, "timed")) << "nothing timed again";
  for (int n : {1, 33}) EXPECT_EQ(again.layer().describe(n), rig.layer().describe(n)) << n;
  std::remove(path.c_str());
}

TEST(TuningGpu, AutotuneRoutesOnBf16LogitsAsTheDeviceReadsThem) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 32, 4, 256, 128);
  c.routing.logits_type = LogitsType::BF16;
  LayerRig rig(c, 16, seed);
  AutotuneOptions o;
  o.tokens = {16};
  o.iters = 3;
  o.routing = "skewed";
  o.check_tokens = 16;
  o.progress = [](const std::string&) {};
  // A reference routed on other logits than the device's fails every
  // candidate, and autotune throws.
  const std::string report = rig.layer().autotune(o);
  EXPECT_NE(report.find("bucket 16 (T=16): tuned: "), std::string::npos) << report;
}

TEST(TuningGpu, AutotuneRefusesBadOptionsAndMissingWeights) {
  UNIMOE_REQUIRE_GPU();
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 8, 2, 256, 128);
  auto field_of = [](MoELayer& layer, const AutotuneOptions& o) -> std::string {
    try {
      layer.autotune(o);
    } catch (const Error& e) {
      return e.field();
    }
    return "no Error";
  };
  LayerRig rig(c, 64, test::fresh_seed());
  AutotuneOptions routing;
  routing.routing = "bogus";
  EXPECT_EQ(field_of(rig.layer(), routing), "autotune.routing");
  AutotuneOptions check;
  check.check_tokens = 0;
  EXPECT_EQ(field_of(rig.layer(), check), "autotune.check_tokens");
  AutotuneOptions tokens;
  tokens.tokens = {65};
  EXPECT_EQ(field_of(rig.layer(), tokens), "autotune.tokens");
  EXPECT_FALSE(rig.impl().tuned_choice(1).has_value()) << "nothing tuned by a refused call";

  const std::unique_ptr<MoELayer> bare = MoELayer::create(c, 64);
  EXPECT_EQ(field_of(*bare, AutotuneOptions{}), "weights");
}

}  // namespace
}  // namespace unimoe
