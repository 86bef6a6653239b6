// The host half of MoELayer::autotune: the options' checks (Error naming the
// field), the buckets tuned and the T each runs at, the logits as the device
// reads them (exact: bf16 bits by the reference's conversion), and the
// relative L2 error of the reference check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "plan/autotune.h"
#include "plan/tuning.h"
#include "ref/ref.h"
#include "ref/synthetic.h"

namespace unimoe {
namespace {

using test::error_of;

AutotuneOptions options_with_tokens(std::vector<int> tokens) {
  AutotuneOptions o;
  o.tokens = std::move(tokens);
  return o;
}

TEST(AutotuneOptions, DefaultsPass) {
  EXPECT_NO_THROW(check_autotune_options(AutotuneOptions{}, 1));
  AutotuneOptions skewed;
  skewed.routing = "skewed";
  EXPECT_NO_THROW(check_autotune_options(skewed, 64));
}

TEST(AutotuneOptions, BadValuesNameTheirField) {
  AutotuneOptions routing;
  routing.routing = "bogus";
  const Error r = error_of([&] { check_autotune_options(routing, 64); });
  EXPECT_EQ(r.field(), "autotune.routing");
  EXPECT_NE(std::string(r.what()).find("uniform, skewed"), std::string::npos) << r.what();

  AutotuneOptions check;
  check.check_tokens = 0;
  EXPECT_EQ(error_of([&] { check_autotune_options(check, 64); }).field(), "autotune.check_tokens");

  AutotuneOptions iters;
  iters.iters = 0;
  EXPECT_EQ(error_of([&] { check_autotune_options(iters, 64); }).field(), "autotune.iters");

  for (int t : {0, -1, 65}) {
    const Error e = error_of([&] { check_autotune_options(options_with_tokens({1, t}), 64); });
    EXPECT_EQ(e.field(), "autotune.tokens") << t;
    EXPECT_NE(std::string(e.what()).find("1..64"), std::string::npos) << e.what();
  }
}

TEST(AutotuneTargets, EveryBucketUpToMaxTokensRunsAtMostMaxTokens) {
  const std::vector<AutotuneTarget> want = {{1, 1}, {2, 2}, {4, 4}, {8, 8}, {16, 16}, {32, 32}, {64, 33}};
  EXPECT_EQ(autotune_targets(AutotuneOptions{}, 33), want);
  EXPECT_EQ(autotune_targets(AutotuneOptions{}, 1), std::vector<AutotuneTarget>({{1, 1}}));
  EXPECT_EQ(autotune_targets(AutotuneOptions{}, 20000).size(), token_buckets(20000).size());
  EXPECT_EQ(autotune_targets(AutotuneOptions{}, 20000).back(), (AutotuneTarget{16384, 16384}));
}

TEST(AutotuneTargets, ListedTokensGiveTheirBucketsInOrderAtTheLargestCount) {
  const std::vector<AutotuneTarget> want = {{1, 1}, {64, 40}};
  EXPECT_EQ(autotune_targets(options_with_tokens({33, 1, 40, 1}), 64), want);
  EXPECT_EQ(autotune_targets(options_with_tokens({20000}), 20000),
            std::vector<AutotuneTarget>({{16384, 20000}}));
}

TEST(AutotuneTargets, CheckTheOptionsFirst) {
  AutotuneOptions o;
  o.routing = "zipf";
  EXPECT_EQ(error_of([&] { autotune_targets(o, 8); }).field(), "autotune.routing");
}

TEST(SyntheticInputs, F32LogitsAreTheBytesOfTheValues) {
  const std::vector<float> logits = {1.0f, -0.3f, 1e-8f, 3.14159f};
  const ref::DeviceLogits d = ref::device_logits(logits, LogitsType::F32);
  EXPECT_EQ(d.values, logits);
  ASSERT_EQ(d.bytes.size(), logits.size() * 4);
  EXPECT_EQ(std::memcmp(d.bytes.data(), logits.data(), d.bytes.size()), 0);
}

TEST(SyntheticInputs, Bf16LogitBytesAndValuesAgree) {
  const std::vector<float> logits = {1.0f, -0.3f, 1.00390625f, 3.14159f, -1e30f, 0.0f};
  const ref::DeviceLogits d = ref::device_logits(logits, LogitsType::BF16);
  ASSERT_EQ(d.bytes.size(), logits.size() * 2);
  ASSERT_EQ(d.values.size(), logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, d.bytes.data() + 2 * i, 2);
    EXPECT_EQ(bits, ref::f32_to_bf16(logits[i])) << i;
    EXPECT_EQ(d.values[i], ref::round_bf16(logits[i])) << i;
  }
  // 1 + 2^-8 is a tie between two bf16 values: to even, 1.0.
  EXPECT_EQ(d.values[2], 1.0f);
  EXPECT_NE(d.values[3], logits[3]) << "pi is not a bf16 value";
}

// The benchmark's GPU and CPU runs and the autotuner take their inputs from
// synthetic_inputs: set s's logits in the config's type, x by seed.
TEST(SyntheticInputs, SetsDifferAndFollowTheConfigsLogitsType) {
  MoEConfig c;
  c.routing.num_experts = 16;
  c.routing.top_k = 2;
  c.experts.hidden = 64;
  c.experts.intermediate = 32;
  const ref::Seeds seeds = ref::seeds_for(7);
  const ref::SyntheticInputs a = ref::synthetic_inputs(c, 5, seeds, 0, "uniform");
  const ref::SyntheticInputs b = ref::synthetic_inputs(c, 5, seeds, 1, "uniform");
  EXPECT_EQ(a.x_seed, seeds.x);
  EXPECT_NE(a.x_seed, b.x_seed);
  EXPECT_EQ(ref::host_x(c, 5, a.x_seed), ref::host_x(c, 5, seeds));
  ASSERT_EQ(a.logits.values.size(), 5u * 16);
  EXPECT_NE(a.logits.values, b.logits.values);
  EXPECT_EQ(a.logits.bytes.size(), 5u * 16 * 4);
  // The same call gives the same inputs.
  EXPECT_EQ(ref::synthetic_inputs(c, 5, seeds, 1, "uniform").logits.values, b.logits.values);
  c.routing.logits_type = LogitsType::BF16;
  const ref::SyntheticInputs h = ref::synthetic_inputs(c, 5, seeds, 0, "uniform");
  ASSERT_EQ(h.logits.bytes.size(), 5u * 16 * 2);
  for (std::size_t i = 0; i < h.logits.values.size(); ++i)
    EXPECT_EQ(h.logits.values[i], ref::round_bf16(a.logits.values[i])) << i;
}

TEST(RelativeL2Error, MatchesTheFormula) {
  const std::vector<float> want = {3.0f, 4.0f};
  // got = (3, 4.5): error 0.5 / 5.
  const std::vector<uint16_t> got = {ref::f32_to_bf16(3.0f), ref::f32_to_bf16(4.5f)};
  EXPECT_DOUBLE_EQ(relative_l2_error(got, want), 0.1);
  EXPECT_EQ(relative_l2_error({ref::f32_to_bf16(3.0f), ref::f32_to_bf16(4.0f)}, want), 0.0);
}

TEST(RelativeL2Error, NanZeroReferenceAndLengthMismatch) {
  const uint16_t nan = ref::f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isinf(relative_l2_error({nan, 0}, {1.0f, 1.0f})));
  EXPECT_TRUE(std::isinf(relative_l2_error({ref::f32_to_bf16(1.0f)}, {0.0f})));
  EXPECT_EQ(relative_l2_error({0}, {0.0f}), 0.0);
  EXPECT_TRUE(std::isinf(relative_l2_error({0, 0}, {0.0f})));
}

}  // namespace
}  // namespace unimoe
