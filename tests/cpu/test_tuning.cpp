// The autotuner's host half: token buckets, the tuning choice's text form,
// tactic names, candidates, the tuner with an injected timer and check, and
// the plan taking a tuned choice. The JSON cache: test_tuning_cache.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <random>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "common/test_util.h"
#include "support/presets.h"
#include "plan/layer_plan.h"
#include "plan/tuning.h"

namespace unimoe {
namespace {

constexpr DeviceArch kH200Arch{9, 0, 132};  // sm_90, 132 SMs



bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The choice's text without its time: what names a candidate.
std::string untimed_text(const TuningChoice& c) {
  const std::string s = c.to_string();
  return s.substr(0, s.find(" time_us="));
}

using test::error_of;

// ---------------------------------------------------------------- buckets ----

TEST(TokenBucket, RoundsUpToPowersOfTwoAndCapsAt16384) {
  const std::vector<std::pair<int, int>> cases = {
      {0, 1},         {1, 1},         {2, 2},         {3, 4},          {4, 4},
      {5, 8},         {1000, 1024},   {1024, 1024},   {1025, 2048},    {16383, 16384},
      {16384, 16384}, {16385, 16384}, {20000, 16384}, {INT_MAX, 16384}};
  for (const auto& [t, bucket] : cases) EXPECT_EQ(token_bucket(t), bucket) << "T=" << t;
  EXPECT_EQ(error_of([] { token_bucket(-1); }).field(), "num_tokens");

  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(1, kMaxTokenBucket);
  for (int i = 0; i < 1000; ++i) {
    const int t = dist(rng), b = token_bucket(t);
    ASSERT_EQ(b & (b - 1), 0) << "T=" << t << " bucket " << b << " is not a power of two";
    ASSERT_GE(b, t);
    ASSERT_LT(b / 2, t) << "T=" << t << " fits the smaller bucket " << b / 2;
  }
}

TEST(TokenBucket, ListsEveryBucketUpToTheLast) {
  EXPECT_EQ(token_buckets(1), std::vector<int>({1}));
  EXPECT_EQ(token_buckets(3), std::vector<int>({1, 2, 4}));
  EXPECT_EQ(token_buckets(64), std::vector<int>({1, 2, 4, 8, 16, 32, 64}));
  const std::vector<int> all = token_buckets(kMaxTokenBucket);
  EXPECT_EQ(all.size(), 15u);
  EXPECT_EQ(all.back(), 16384);
  EXPECT_EQ(token_buckets(100000), all);
  for (int b : all) EXPECT_NO_THROW(check_token_bucket(b));
  for (int b : {0, 3, 100, 32768, -4})
    EXPECT_EQ(error_of([&] { check_token_bucket(b); }).field(), "bucket") << b;
}

// ---------------------------------------------------------------- tactics ----

TEST(Tactics, NamesRoundTripAndErrorsListTheCompiledOnes) {
  for (const GemmTactic& t : kMmaTactics) EXPECT_EQ(parse_gemm_tactic(t.to_string()), t);
  EXPECT_EQ(parse_gemm_tactic("m16n64"), (GemmTactic{16, 64}));
  EXPECT_EQ(parse_gemm_tactic("m32n64x5"), (GemmTactic{32, 64, false, 5}));
  EXPECT_NE(parse_gemm_tactic("m32n64x5"), parse_gemm_tactic("m32n64"));
  EXPECT_EQ(parse_gemm_tactic("wg_m128n256"), (GemmTactic{128, 256, false, 0, true}));
  EXPECT_NE(parse_gemm_tactic("wg_m128n128"), parse_gemm_tactic("m128n128"));
  EXPECT_THROW(parse_gemm_tactic("m128n256"), Error);  // the 256-column tile is wgmma only
  EXPECT_THROW(parse_gemm_tactic("m32n64x4"), Error);  // no such build
  const Error mma = error_of([] { parse_gemm_tactic("m32n128"); });
  EXPECT_EQ(mma.field(), "mma_tactic");
  EXPECT_TRUE(contains(mma.what(), "allowed: m128n128, m64n128, m48n128, m32n64, m32n64x5, m16n128, m16n64, m16n32, "
                                 "wg_m128n256, wg_m128n128, stream_m16")) << mma.what();

  EXPECT_EQ(to_string(Sm90GemmTactic::Cooperative128x128), "coop_128x128x64");
  EXPECT_EQ(to_string(Sm90GemmTactic::Cooperative128x256), "coop_128x256x64");
  EXPECT_EQ(to_string(Sm90GemmTactic::Pingpong64x128), "pingpong_64x128x64");
  for (Sm90GemmTactic t : kSm90GemmTactics) EXPECT_EQ(parse_sm90_gemm_tactic(to_string(t)), t);
  const Error sm90 = error_of([] { parse_sm90_gemm_tactic("coop"); });
  EXPECT_EQ(sm90.field(), "sm90_tactic");
  EXPECT_TRUE(contains(sm90.what(), "coop_128x128x64, coop_128x256x64, pingpong_64x128x64"))
      << sm90.what();
}

// ----------------------------------------------------------------- choice ----

TEST(TuningChoice, TextFormRoundTrips) {
  const std::string line = "path=mma gemm1=m16n64 gemm2=m16n128 sm90=coop_128x128x64 time_us=67.8";
  const TuningChoice c = TuningChoice::parse(line);
  EXPECT_EQ(c.path, ExpertsPath::Mma);
  EXPECT_EQ(c.gemm1, (GemmTactic{16, 64}));
  EXPECT_EQ(c.gemm2, (GemmTactic{16, 128}));
  EXPECT_EQ(c.sm90, Sm90GemmTactic::Cooperative128x128);
  EXPECT_EQ(c.time_us, 67.8);
  EXPECT_EQ(c.to_string(), line);
  // Keys in any order and extra spaces parse to the same choice.
  EXPECT_EQ(TuningChoice::parse(
                " time_us=67.8  sm90=coop_128x128x64 gemm2=m16n128 gemm1=m16n64 path=mma"),
            c);

  // Every candidate with random times, printed and parsed back, is the same
  // choice to the last bit of its time.
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> time(0, 1e4);
  for (TuningChoice cand : candidates_for(find_preset("qwen3-30b-a3b").config, 64, kH200Arch)) {
    cand.time_us = time(rng);
    EXPECT_EQ(TuningChoice::parse(cand.to_string()), cand) << cand.to_string();
  }
}

TEST(TuningChoice, ParseErrorsNameTheProblem) {
  const std::string ok_tail = " sm90=coop_128x128x64 time_us=1";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"path=mma gemm1=m16n64" + ok_tail, "missing key 'gemm2'"},
      {"path=mma gemm1=m16n64 gemm2=m16n64 gemm2=m16n64" + ok_tail, "given twice"},
      {"path=mma gemm1=m16n64 gemm2=m16n64 tile=16" + ok_tail, "unknown key 'tile'"},
      {"path=mma gemm1=m16n64 gemm2=m16n64 junk" + ok_tail, "'junk' is not key=value"},
      {"path=mma gemm1=m16n64 gemm2=m64n128" + ok_tail, "need the same tile_m"},
      {"path=mma gemm1=stream_m16 gemm2=stream_m16" + ok_tail, "the mma path runs tiled tactics"},
      {"path=stream gemm1=m16n64 gemm2=m16n64" + ok_tail, "the stream path runs stream_m16"},
  };
  for (const auto& c : cases) {
    const Error e = error_of([&] { TuningChoice::parse(c.first); });
    EXPECT_EQ(e.field(), "tuning_choice") << c.first;
    EXPECT_TRUE(contains(e.what(), c.second)) << c.first << " -> " << e.what();
  }
  const std::string head = "path=mma gemm1=m16n64 gemm2=m16n64 sm90=coop_128x128x64 time_us=";
  for (const std::string bad : {"-1", "abc", "nan", "inf", "1.5x", ""}) {
    const Error e = error_of([&] { TuningChoice::parse(head + bad); });
    EXPECT_TRUE(contains(e.what(), "not a finite number")) << bad << " -> " << e.what();
  }
  // A bad value names its own field.
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"path=triton gemm1=m16n64 gemm2=m16n64" + ok_tail, "path"},
      {"path=mma gemm1=m8n64 gemm2=m16n64" + ok_tail, "mma_tactic"},
      {"path=mma gemm1=m16n64 gemm2=m16n64 sm90=coop time_us=1", "sm90_tactic"},
  };
  for (const auto& f : fields)
    EXPECT_EQ(error_of([&] { TuningChoice::parse(f.first); }).field(), f.second) << f.first;
}

// ------------------------------------------------------------- candidates ----

TEST(Candidates, EveryBackendWithEveryCompiledTactic) {
  MoEConfig c = find_preset("dsv3-tp8").config;
  const std::vector<TuningChoice> all = candidates_for(c, 1, kH200Arch);
  // Independent count of the Mma pairs: sum over tile_m of (tiled tactics
  // with that tile_m)^2.
  std::size_t pairs = 0;
  for (const GemmTactic& a : kMmaTactics)
    for (const GemmTactic& b : kMmaTactics)
      pairs += !a.stream && !b.stream && !a.wgmma && !b.wgmma && a.tile_m == b.tile_m;
  // m128, m64, m48: 1 each; m32: 2 x 2 (m32n64, m32n64x5); m16: 3 x 3. The
  // wgmma tactics are not offered yet.
  EXPECT_EQ(pairs, 16u);
  ASSERT_EQ(all.size(), pairs + 1 + kNumSm90GemmTactics);  // + the stream tactic
  std::vector<Sm90GemmTactic> sm90;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const TuningChoice& x = all[i];
    EXPECT_EQ(x.time_us, 0);
    EXPECT_NO_THROW(check_choice_tactics(x)) << x.to_string();
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(all[j], x) << "duplicate " << x.to_string();
    if (i < pairs) {
      EXPECT_EQ(x.path, ExpertsPath::Mma) << "mma candidates come first";
      EXPECT_FALSE(x.gemm1.stream || x.gemm2.stream) << x.to_string();
    } else if (i == pairs) {
      EXPECT_EQ(x.path, ExpertsPath::Stream);
      EXPECT_EQ(x.gemm1.to_string(), "stream_m16");
    } else {
      EXPECT_EQ(x.path, ExpertsPath::Cutlass);
      sm90.push_back(x.sm90);
    }
  }
  EXPECT_EQ(sm90,
            std::vector<Sm90GemmTactic>(std::begin(kSm90GemmTactics), std::end(kSm90GemmTactics)));

  // A forced backend offers only its own.
  for (ExpertsPath p : kExpertsPaths) {
    c.options.backend = path_name(p);
    const auto only = candidates_for(c, 4096, kH200Arch);
    const std::size_t want = p == ExpertsPath::Mma ? pairs : p == ExpertsPath::Stream ? 1 : kNumSm90GemmTactics;
    EXPECT_EQ(only.size(), want) << path_name(p);
    for (const TuningChoice& x : only) EXPECT_EQ(x.path, p);
  }
  EXPECT_EQ(error_of([&] { candidates_for(c, 3, kH200Arch); }).field(), "bucket");
}

TEST(Candidates, WgmmaKernelsOnlyWhereAskedFor) {
  MoEConfig c = find_preset("qwen3-30b-a3b").config;
  auto wgmma_pairs = [](const std::vector<TuningChoice>& list) {
    std::size_t n = 0;
    for (const TuningChoice& x : list) n += x.path == ExpertsPath::Mma && (x.gemm1.wgmma || x.gemm2.wgmma);
    return n;
  };
  const std::vector<TuningChoice> plain = candidates_for(c, 4096, kH200Arch);
  const std::vector<TuningChoice> with = candidates_for(c, 4096, kH200Arch, true);
  EXPECT_EQ(wgmma_pairs(plain), 0u);
  // wg_m128n256 and wg_m128n128 pair with each other and with m128n128 (one
  // tile_m): 3 x 3 - 1 pairs hold a wgmma tactic.
  EXPECT_EQ(wgmma_pairs(with), 8u);
  EXPECT_EQ(with.size(), plain.size() + 8u);
  for (const TuningChoice& x : with) EXPECT_NO_THROW(check_choice_tactics(x)) << x.to_string();

  // FP8: the mma path (the FP8 wgmma kernel) is one more candidate, planned
  // as that kernel runs.
  for (QuantVariant q : {QuantVariant::FP8Block128, QuantVariant::FP8PerTensor}) {
    c.experts.quant = q;
    const std::vector<TuningChoice> fp8 = candidates_for(c, 4096, kH200Arch);
    const std::vector<TuningChoice> fp8_with = candidates_for(c, 4096, kH200Arch, true);
    ASSERT_EQ(fp8_with.size(), fp8.size() + 1);
    for (const TuningChoice& x : fp8) EXPECT_NE(x.path, ExpertsPath::Mma) << x.to_string();
    const TuningChoice& mma = fp8_with.front();
    EXPECT_EQ(mma.path, ExpertsPath::Mma);
    const LayerPlan plan = plan_for_tokens(c, 4096, &mma);
    EXPECT_EQ(plan.path, ExpertsPath::Mma);
    EXPECT_EQ(plan.tile_m, 128);
    EXPECT_TRUE(plan.gemm1 == kFp8MmaTactic && plan.gemm2 == kFp8MmaTactic) << plan.to_string();
  }
}

TEST(Candidates, BackendsThatCannotServeAreNotOffered) {
  MoEConfig c = find_preset("qwen3-30b-a3b").config;
  // Not Hopper: the kernels are sm_90a only.
  const DeviceArch ampere{8, 0, 108};
  EXPECT_TRUE(candidates_for(c, 1, ampere).empty());
  for (ExpertsPath p : kExpertsPaths) {
    EXPECT_EQ(backend_unsupported_reason(p, c, kH200Arch), "") << path_name(p);
    const std::string why = backend_unsupported_reason(p, c, ampere);
    EXPECT_TRUE(contains(why, "built for sm_90a") && contains(why, "sm_80")) << why;
  }
  // The 4-bit variants: the stream path's candidates only.
  c.experts.quant = QuantVariant::NVFP4;
  const std::vector<TuningChoice> w4 = candidates_for(c, 1, kH200Arch);
  EXPECT_FALSE(w4.empty());
  for (const TuningChoice& choice : w4) EXPECT_EQ(choice.path, ExpertsPath::Stream) << choice.to_string();
  EXPECT_TRUE(contains(backend_unsupported_reason(ExpertsPath::Cutlass, c, kH200Arch),
                       "cutlass: NVFP4 runs on the stream path only"));
}

// ------------------------------------------------------------------ tuner ----

TEST(Tuner, PicksTheFastestPassingCandidateAndReportsEach) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<TuningChoice> cands = candidates_for(find_preset("mixtral-8x7b").config, 256, kH200Arch);
  std::uniform_real_distribution<double> time(1, 100);
  std::vector<double> times;
  std::vector<bool> pass;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    times.push_back(time(rng));
    pass.push_back(i == 0 || rng() % 3 != 0);  // some fail, never all
  }
  auto index = [&](const TuningChoice& c) {
    for (std::size_t i = 0; i < cands.size(); ++i)
      if (untimed_text(cands[i]) == untimed_text(c)) return i;
    ADD_FAILURE() << "not a candidate: " << c.to_string();
    return std::size_t{0};
  };
  std::vector<std::string> lines;
  int timed_failing = 0;
  Tuner tuner(
      [&](const TuningChoice& c) {
        timed_failing += !pass[index(c)];
        return times[index(c)];
      },
      [&](const TuningChoice& c, std::string* why) {
        if (!pass[index(c)]) *why = "rel_l2 0.5 > 0.01";
        return pass[index(c)];
      },
      [&](const std::string& line) { lines.push_back(line); });
  const TuningChoice best = tuner.tune(cands);

  std::size_t expected = 0;
  for (std::size_t i = 1; i < cands.size(); ++i)
    if (pass[i] && times[i] < times[expected]) expected = i;
  EXPECT_EQ(index(best), expected) << best.to_string();
  EXPECT_EQ(best.time_us, times[expected]);
  EXPECT_EQ(timed_failing, 0) << "a candidate that failed its check was timed";
  ASSERT_EQ(lines.size(), cands.size() + 1);
  for (std::size_t i = 0; i < cands.size(); ++i) {
    SCOPED_TRACE(lines[i]);
    EXPECT_TRUE(contains(lines[i], untimed_text(cands[i])));
    EXPECT_EQ(contains(lines[i], "rejected") && contains(lines[i], "rel_l2 0.5 > 0.01"), !pass[i]);
  }
  EXPECT_EQ(lines.back(), "winner " + best.to_string());
}

TEST(Tuner, ExcludesAFastCandidateThatFailsAndBreaksTiesToTheEarlier) {
  const std::vector<TuningChoice> cands = candidates_for(find_preset("dsv3-tp8").config, 8, kH200Arch);
  ASSERT_GE(cands.size(), 4u);
  // Candidate 0 is fastest but wrong; 1 and 3 tie for the best passing time.
  const std::vector<double> times = {1, 5, 9, 5};
  auto at = [&](const TuningChoice& c) {
    for (std::size_t i = 0; i < cands.size(); ++i)
      if (untimed_text(cands[i]) == untimed_text(c)) return i;
    return cands.size();
  };
  Tuner tuner([&](const TuningChoice& c) { return at(c) < times.size() ? times[at(c)] : 50.0; },
              [&](const TuningChoice& c, std::string* why) {
                *why = "mismatch";
                return at(c) != 0;
              });
  TuningChoice expected = cands[1];
  expected.time_us = 5;
  EXPECT_EQ(tuner.tune(cands), expected);
}

TEST(Tuner, ACandidateThatThrowsIsRejectedAndTheOthersStillRun) {
  const std::vector<TuningChoice> cands = candidates_for(find_preset("dsv3-tp8").config, 8, kH200Arch);
  ASSERT_GE(cands.size(), 2u);
  std::vector<std::string> lines;
  Tuner tuner(
      [&](const TuningChoice& c) {
        if (untimed_text(c) == untimed_text(cands[0])) throw std::runtime_error("tactic not compiled");
        return 7.0;
      },
      [](const TuningChoice&, std::string*) { return true; },
      [&](const std::string& line) { lines.push_back(line); });
  TuningChoice expected = cands[1];
  expected.time_us = 7;
  EXPECT_EQ(tuner.tune(cands), expected);
  EXPECT_TRUE(contains(lines.front(), "threw: tactic not compiled")) << lines.front();
}

TEST(Tuner, ThrowsWithEveryReasonWhenAllFail) {
  const std::vector<TuningChoice> cands = candidates_for(find_preset("dsv3-tp8").config, 8, kH200Arch);
  std::vector<std::string> lines;
  Tuner tuner([](const TuningChoice& c) { return c.path == ExpertsPath::Mma ? NAN : -1.0; },
              [](const TuningChoice& c, std::string* why) {
                *why = "wrong sums";
                return c.path == ExpertsPath::Cutlass;  // mma fails its check
              },
              [&](const std::string& line) { lines.push_back(line); });
  try {
    tuner.tune(cands);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "every candidate failed")) << e.what();
    EXPECT_TRUE(contains(e.what(), "reference check failed: wrong sums")) << e.what();
    EXPECT_TRUE(contains(e.what(), "timing failed: time_us -1")) << e.what();
  }
  EXPECT_EQ(lines.size(), cands.size());  // one rejection each, no winner
  EXPECT_THROW(tuner.tune({}), std::runtime_error);
}

// ------------------------------------------------------------------- plan ----

TEST(TunedPlan, TakesTheTunedPathAndTactics) {
  const MoEConfig c = find_preset("dsv3-tp8").config;
  // Without a choice the rule holds: T=1 streams (layer_plan.cpp).
  const LayerPlan rule = plan_for_tokens(c, 1);
  EXPECT_EQ(rule.gemm1.to_string(), "stream_m16");
  TuningChoice mma =
      TuningChoice::parse("path=mma gemm1=m64n128 gemm2=m64n128 sm90=coop_128x128x64 time_us=3");
  const LayerPlan tuned = plan_for_tokens(c, 1, &mma);
  EXPECT_EQ(tuned.path, ExpertsPath::Mma);
  EXPECT_EQ(tuned.tile_m, 64);
  EXPECT_EQ(tuned.gemm1, (GemmTactic{64, 128}));
  EXPECT_EQ(tuned.gemm2, (GemmTactic{64, 128}));
  EXPECT_TRUE(rule.overlap_stream_gemms);    // the stream path at I = 256
  EXPECT_FALSE(tuned.overlap_stream_gemms);  // not on the Mma path
  // The Mma path where the rule takes the Cutlass one.
  ASSERT_EQ(plan_for_tokens(c, 16384).path, ExpertsPath::Cutlass);
  mma = TuningChoice::parse("path=mma gemm1=m16n128 gemm2=m16n64 sm90=coop_128x128x64 time_us=3");
  const LayerPlan big = plan_for_tokens(c, 16384, &mma);
  EXPECT_EQ(big.path, ExpertsPath::Mma);
  EXPECT_EQ(big.tile_m, 16);
  EXPECT_EQ(big.gemm2, (GemmTactic{16, 64}));

  const TuningChoice stream =
      TuningChoice::parse("path=stream gemm1=stream_m16 gemm2=stream_m16 sm90=coop_128x128x64 time_us=2");
  const LayerPlan sp = plan_for_tokens(c, 16384, &stream);
  EXPECT_EQ(sp.path, ExpertsPath::Stream);
  EXPECT_EQ(sp.tile_m, 16);
  EXPECT_EQ(sp.gemm2.to_string(), "stream_m16");
  EXPECT_TRUE(sp.overlap_stream_gemms);  // a tuned stream path overlaps too

  TuningChoice cutlass;
  cutlass.path = ExpertsPath::Cutlass;
  cutlass.sm90 = Sm90GemmTactic::Pingpong64x128;
  const LayerPlan cp = plan_for_tokens(c, 1, &cutlass);
  EXPECT_EQ(cp.path, ExpertsPath::Cutlass);
  EXPECT_EQ(cp.sm90, Sm90GemmTactic::Pingpong64x128);
  EXPECT_EQ(cp.tile_m, rule.tile_m);  // the unused Mma fields keep the rule's

  MoEConfig forced = c;
  forced.options.backend = "mma";
  EXPECT_EQ(error_of([&] { plan_for_tokens(forced, 1, &cutlass); }).field(),
            "tuning_choice");
  mma.gemm2 = GemmTactic{64, 128};
  EXPECT_EQ(error_of([&] { plan_for_tokens(c, 1, &mma); }).field(), "tuning_choice");
}

}  // namespace
}  // namespace unimoe
