// The FP8 decode GEMM1's L2 prefetch of GEMM2's weights (NextWeightsPrefetch,
// development knob next_prefetch): a hint, so the layer with it (the
// default) writes the layer without it bit for bit, and both match the CPU
// reference. The 4-bit variants, which do not prefetch, run too: the knob
// must change nothing there. Fresh weights and inputs each
// run, output poisoned (LayerRig), T = 1 (the one-token path), a repeated
// expert (a two-row tile), one hot expert over more tiles than the prefetch
// takes, an EP local range, the model shapes it serves at decode, and
// graph replays with fresh routing.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "gpu/layer_rig.h"
#include "plan/autotune.h"
#include "ref/ref.h"
#include "ref/synthetic.h"
#include "support/presets.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;
using test::hot_expert_logits;
using test::LayerRig;

constexpr QuantVariant kVariants[] = {QuantVariant::FP8Block128, QuantVariant::FP8PerTensor,
                                      QuantVariant::MXFP4, QuantVariant::NVFP4};

double tolerance(QuantVariant q) {
  return q == QuantVariant::MXFP4 || q == QuantVariant::NVFP4 ? kTuningTolerance : kFp8Tolerance;
}

// The layer with and without the prefetch on the same weights, inputs and
// routing, at each T (logits of `kind`).
void check_shape(MoEConfig c, const std::vector<int>& tokens, const std::string& kind) {
  DevOverrides off;
  off.set("next_prefetch=0");
  for (QuantVariant q : kVariants) {
    c.experts.quant = q;
    c.options.backend = "stream";
    const uint64_t seed = test::fresh_seed();
    int max_t = 1;
    for (int t : tokens) max_t = std::max(max_t, t);
    LayerRig with(c, max_t, seed);
    LayerRig without(c, max_t, seed, false, &off);
    for (int t : tokens) {
      SCOPED_TRACE(to_string(q) + " " + c.to_string() + " T=" + std::to_string(t) + " " + kind +
                   " seed " + std::to_string(seed));
      const std::vector<float> logits =
          kind == "hot" ? hot_expert_logits(c, t, seed + t, int(seed % c.routing.num_experts))
                        : ref::make_logits(c, t, seed + t, kind);
      for (LayerRig* rig : {&with, &without}) {
        rig->load_inputs(t, seed ^ t, logits);
        rig->layer().forward(rig->args(t), nullptr);
      }
      EXPECT_EQ(with.output_bits(t), without.output_bits(t));
      EXPECT_LT(with.error(t, logits), tolerance(q)) << with.layer().describe(t);
    }
  }
}

TEST(NextPrefetchGpu, SmallShapeEveryVariant) {
  UNIMOE_REQUIRE_GPU();
  // I = 384: three scale blocks in GEMM2 (FP8), three 128-value steps (4-bit).
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 16, 4, 512, 384);
  check_shape(c, {1, 2, 5}, "uniform");
  check_shape(c, {1, 3, 9}, "hot");
}

TEST(NextPrefetchGpu, ExpertParallelRange) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 64, 8, 256, 128);
  c.experts.local_expert_offset = 16;
  c.experts.num_local_experts = 16;
  check_shape(c, {1, 4}, "uniform");
}

TEST(NextPrefetchGpu, ModelShapesAtDecode) {
  UNIMOE_REQUIRE_GPU();
  for (const char* name : {"dsv3-tp8", "gpt-oss-120b"}) {
    MoEConfig c = find_preset(name).config;
    const bool w4_only = std::string(name) == "gpt-oss-120b";  // H = 2880: not FP8Block128's
    DevOverrides off;
    off.set("next_prefetch=0");
    for (QuantVariant q : kVariants) {
      const bool w4 = q == QuantVariant::MXFP4 || q == QuantVariant::NVFP4;
      if (w4_only && !w4) continue;
      c.experts.quant = q;
      c.options.backend = "stream";
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(to_string(q) + " " + name + " seed " + std::to_string(seed));
      LayerRig with(c, 1, seed);
      LayerRig without(c, 1, seed, false, &off);
      const std::vector<float> logits = ref::make_logits(c, 1, seed, "uniform");
      for (LayerRig* rig : {&with, &without}) {
        rig->load_inputs(1, seed ^ 1, logits);
        rig->layer().forward(rig->args(1), nullptr);
      }
      EXPECT_EQ(with.output_bits(1), without.output_bits(1));
      EXPECT_LT(with.error(1, logits), tolerance(q));
    }
  }
}

TEST(NextPrefetchGpu, GraphReplaysWithFreshRouting) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 16, 4, 512, 384);
  for (QuantVariant q : kVariants) {
    c.experts.quant = q;
    c.options.backend = "stream";
    const uint64_t seed = test::fresh_seed();
    LayerRig rig(c, 4, seed);
    for (int t : {1, 4}) {
      test::CapturedForward graph(rig.layer(), rig.args(t));
      for (int replay = 0; replay < 3; ++replay) {
        SCOPED_TRACE(to_string(q) + " T=" + std::to_string(t) + " replay " +
                     std::to_string(replay) + " seed " + std::to_string(seed));
        const std::vector<float> fresh =
            replay == 1 ? hot_expert_logits(c, t, seed + replay, 3)
                        : ref::make_logits(c, t, seed + 7 * replay, "uniform");
        rig.load_inputs(t, seed + 100 + replay, fresh);
        graph.replay();
        EXPECT_LT(rig.error(t, fresh), tolerance(q));
      }
    }
  }
}

}  // namespace
}  // namespace unimoe
