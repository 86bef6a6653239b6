// The tuned layer on the device: every tuning candidate (path and tactics)
// computes the reference's output, a winner saved to the tuning cache is
// reused without timing, a deliberately wrong candidate is excluded by the
// reference check, and a tuned forward captures in a CUDA graph.
// Metric: test::kLayerTolerance (gpu/layer_rig.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu/layer_rig.h"
#include "plan/presets.h"
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
  other.gpu_name = "NVIDIA H100 80GB HBM3";
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

}  // namespace
}  // namespace unimoe
