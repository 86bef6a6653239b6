// The whole FP8 layer on the device (FP8Block128; FP8PerTensor with dynamic
// and with static activation scales), on both FP8 paths (stream and
// cutlass), against the CPU reference with the same quantization emulation:
// fresh random weights and inputs each run (the device quantizes the
// weights from the synthetic generator, the host regenerates the same
// codes and scales), output poisoned before each run, odd sizes, empty
// experts, one hot expert, an EP local range with off-rank rows, every
// activation with biases, precomputed routing, CUDA-graph replay with fresh
// routing, and the weight checks of set_weights.
//
// Metric: relative L2 error of the whole output below kFp8Tolerance (1e-2,
// plan/autotune.h says why: the weights and the device's quantization of
// each GEMM input follow the reference's rule exactly, so the differences
// are fp32 accumulation order, which moves an intermediate element across
// an e4m3 rounding boundary only rarely, and y and the output rounded to
// bf16), plus the reference's flip allowance where an intermediate element
// lies within 1e-4 (relative) of such a boundary, or on the wgmma paths
// (cutlass, mma) within what their coarser GEMM1 sums may move it
// (support/reference_check.h): at one token and I = 128 one such element
// can move the output by 2e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
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
using test::field_of;
using test::LayerRig;
constexpr double kTolerance = kFp8Tolerance;

using Form = test::Fp8Form;
constexpr auto& kForms = test::kFp8Forms;
constexpr const char* kBackends[] = {"stream", "cutlass", "mma"};

// One fresh set of weights and inputs per point, run by each FP8 form on
// each backend; the largest error of the point is printed.
void check_point(MoEConfig c, int t, const std::string& kind) {
  const uint64_t seed = test::fresh_seed();
  const std::vector<float> logits =
      kind == "hot" ? hot_expert_logits(c, t, seed, int(seed % c.routing.num_experts))
                    : ref::make_logits(c, t, seed, kind);
  for (const Form& form : kForms) {
    c.experts.quant = form.quant;
    double worst = 0, widest = 0;
    for (const char* backend : kBackends) {
      c.options.backend = backend;
      SCOPED_TRACE(std::string(form.name) + " " + c.to_string() + " T=" + std::to_string(t) + " " +
                   kind + " seed " + std::to_string(seed));
      LayerRig rig(c, t, seed, form.static_scales);
      rig.load_inputs(t, seed ^ 0xabc, logits);
      rig.layer().forward(rig.args(t), nullptr);
      // The same output on every path; the allowance is the path's.
      const std::vector<float> want = rig.reference(t, logits);
      const double allowance = rig.flip_allowance();
      const double err = rig.error_against(t, want);
      // The bound, plus what the intermediate's near ties may move the
      // output by (ref::moe_forward's flip_allowance; 0 on most points).
      EXPECT_LT(err, kTolerance + allowance);
      worst = std::max(worst, err);
      widest = std::max(widest, allowance);
    }
    std::printf("  %s H=%d I=%d T=%d %s: largest error %.2e (near ties allow up to %.2e more)\n",
                form.name, c.experts.hidden, c.experts.intermediate, t, kind.c_str(), worst,
                widest);
  }
}

TEST(LayerFp8Gpu, TokenCountsOnOneShape) {
  UNIMOE_REQUIRE_GPU();
  // I = 384: three K blocks in GEMM2; rows per expert T * 4 / 16.
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 16, 4, 512, 384);
  for (int t : {1, 3, 8, 33, 130}) check_point(c, t, "uniform");
}

TEST(LayerFp8Gpu, DeepSeekShapeAtDecode) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig ds = find_preset("dsv3-tp8").config;  // H 7168, I 256, E 256, K 8
  for (int t : {1, 4}) check_point(ds, t, "uniform");
}

TEST(LayerFp8Gpu, EveryActivationWithBiases) {
  UNIMOE_REQUIRE_GPU();
  for (Activation act : {Activation::SwiGLU, Activation::GeGLU, Activation::ReLU2, Activation::SwiGLUOai}) {
    MoEConfig c = moe_config(RoutingPolicy::Renormalize, 12, 3, 256, 128);
    c.experts.activation = act;
    c.experts.has_bias = act != Activation::SwiGLU;
    for (int t : {1, 50}) check_point(c, t, "uniform");
  }
}

TEST(LayerFp8Gpu, OneHotExpertAndEmptyExperts) {
  UNIMOE_REQUIRE_GPU();
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 64, 4, 256, 256);
  for (int t : {1, 40}) check_point(c, t, "hot");
  check_point(c, 300, "skewed");
}

TEST(LayerFp8Gpu, ExpertParallelRangeDropsOffRankRows) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 64, 8, 256, 128);
  c.experts.local_expert_offset = 16;
  c.experts.num_local_experts = 16;
  for (int t : {1, 7, 200}) check_point(c, t, "uniform");
}

TEST(LayerFp8Gpu, PrecomputedRouting) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 32, 4, 256, 128);
  c.experts.quant = QuantVariant::FP8Block128;
  const int t = 77;
  LayerRig rig(c, t, seed);
  EXPECT_LT(rig.precomputed_routing_error(t, seed), kTolerance);
}

// FP8PerTensor with dynamic scales on the cutlass path, with the one-pass
// forms (each tensor scale made first, fp8_tensor_scale_first, the
// default): the same codes and scales as the two-pass forms (quantize in
// token order and gather; the dynamic quantize of the fp32 activation),
// so the same output bits, within the bound of the reference; eager and
// replayed from a graph with fresh routing.
TEST(LayerFp8Gpu, DynamicTensorScaleFirstGivesTheDefaultFormsBits) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 16, 4, 512, 384);
  c.experts.quant = QuantVariant::FP8PerTensor;
  c.options.backend = "cutlass";
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "not fused");
    DevOverrides first;
    first.fp8_act_quant_fused = fused;
    DevOverrides plain;
    plain.fp8_tensor_scale_first = false;
    test::expect_same_bits(c, seed, false, first, plain, {1, 33, 130}, 64, kTolerance, 5);
  }
}

// The stream path's quantize kernels letting their GEMM launch once their
// wait is over (fp8_quant_early, the default) changes when the GEMMs
// start, not what they compute: every FP8 form gives the bits of the
// launch at the end (fp8_quant_early=0), within the reference's bound, at
// decode sizes (the early form runs for quantize grids of at most 64 CTAs:
// x at T=32 and H=2048 is 32 x 16 groups, 64 CTAs), eager and replayed
// from a graph with fresh routing.
TEST(LayerFp8Gpu, EarlyLaunchedDecodeGemmsGiveTheBitsOfTheLateLaunch) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  MoEConfig c = find_preset("qwen3-30b-a3b").config;
  c.options.backend = "stream";
  for (const Form& form : kForms) {
    SCOPED_TRACE(form.name);
    c.experts.quant = form.quant;
    DevOverrides late;
    late.fp8_quant_early = false;
    test::expect_same_bits(c, seed, form.static_scales, DevOverrides{}, late, {1, 3, 32}, 8,
                           kTolerance, 5);
  }
}

class LayerFp8GraphGpu : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Backends, LayerFp8GraphGpu, ::testing::ValuesIn(kBackends));

TEST_P(LayerFp8GraphGpu, CapturedOnceReplaysWithFreshRouting) {
  UNIMOE_REQUIRE_GPU();
  for (const Form& form : kForms) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(std::string(GetParam()) + " " + form.name + " seed " + std::to_string(seed));
    MoEConfig c = find_preset("qwen3-30b-a3b").config;
    c.experts.quant = form.quant;
    c.options.backend = GetParam();
    const int t = 37;
    LayerRig rig(c, t, seed, form.static_scales);
    rig.load_inputs(t, seed, ref::make_logits(c, t, seed, "uniform"));
    test::CapturedForward graph(rig.layer(), rig.args(t));
    for (int replay = 0; replay < 3; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      const std::vector<float> logits = replay == 1 ? hot_expert_logits(c, t, seed + replay, 5)
                                                    : ref::make_logits(c, t, seed + replay, "uniform");
      rig.load_inputs(t, seed + 100 + replay, logits);
      graph.replay();
      EXPECT_LT(rig.error(t, logits), kTolerance);
    }
  }
}

// The autotuner times the stream and cutlass paths (the mma path's wgmma
// kernel is not offered yet), checks each against the reference on the
// layer's own (dequantized) weights, and serves the winner.
TEST(LayerFp8Gpu, AutotuneTimesBothPathsAndServesTheWinner) {
  UNIMOE_REQUIRE_GPU();
  for (const Form& form : kForms) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(std::string(form.name) + " seed " + std::to_string(seed));
    MoEConfig c = moe_config(RoutingPolicy::Renormalize, 16, 4, 256, 128);
    c.experts.quant = form.quant;
    LayerRig rig(c, 64, seed, form.static_scales);
    AutotuneOptions o;
    o.tokens = {1, 33};
    o.iters = 3;
    std::vector<std::string> lines;
    o.progress = [&](const std::string& line) { lines.push_back(line); };
    const std::string report = rig.layer().autotune(o);
    int timed_stream = 0, timed_cutlass = 0, timed_mma = 0;
    for (const std::string& line : lines) {
      if (line.rfind("timed ", 0) != 0) continue;
      timed_stream += line.find("path=stream") != std::string::npos;
      timed_cutlass += line.find("path=cutlass") != std::string::npos;
      timed_mma += line.find("path=mma") != std::string::npos;
    }
    EXPECT_GT(timed_stream, 0) << report;
    EXPECT_GT(timed_cutlass, 0) << report;
    EXPECT_EQ(timed_mma, 0) << report;
    for (int t : {1, 33}) {
      const std::vector<float> logits = ref::make_logits(c, t, seed + t, "uniform");
      rig.load_inputs(t, seed ^ t, logits);
      rig.layer().forward(rig.args(t), nullptr);
      EXPECT_LT(rig.error(t, logits), kTolerance) << "T=" << t << " " << rig.layer().describe(t);
    }
  }
}


TEST(LayerFp8Gpu, SetWeightsChecksTheScalesOfEachVariant) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 8, 2, 128, 128);
  c.experts.quant = QuantVariant::FP8Block128;
  LayerRig rig(c, 4, 1);
  DeviceBuffer<uint8_t> w(8 * 256 * 128);
  DeviceBuffer<float> s(64);
  ExpertWeights ok{w.get(), w.get(), nullptr, nullptr, s.get(), s.get()};
  ExpertWeights no_scale = ok;
  no_scale.w2_scale = nullptr;
  EXPECT_EQ(field_of([&] { rig.layer().set_weights(no_scale); }), "weights.w2_scale");
  ExpertWeights static_for_block = ok;
  static_for_block.x_scale = s.get();
  EXPECT_EQ(field_of([&] { rig.layer().set_weights(static_for_block); }), "weights.x_scale");
  // fp32 scales: 4-byte alignment (a rank's slice starts where its first
  // expert's scales do), not 2.
  ExpertWeights sliced = ok;
  sliced.w13_scale = s.get() + 1;
  EXPECT_EQ(field_of([&] { rig.layer().set_weights(sliced); }), "no error");
  ExpertWeights misaligned = ok;
  misaligned.w13_scale = reinterpret_cast<const float*>(reinterpret_cast<const char*>(s.get()) + 2);
  EXPECT_EQ(field_of([&] { rig.layer().set_weights(misaligned); }), "weights.w13_scale");
  // FP8PerTensor's static activation scales: positive and finite, read
  // back by set_weights (a zero, a negative, an infinite or a NaN scale is
  // refused naming the field).
  MoEConfig pt = c;
  pt.experts.quant = QuantVariant::FP8PerTensor;
  LayerRig per_tensor(pt, 4, 1);
  for (const float bad : {0.0f, -0.5f, INFINITY, NAN}) {
    DeviceBuffer<float> good(std::vector<float>{0.01f}), wrong(std::vector<float>{bad});
    ExpertWeights given = ok;
    given.x_scale = good.get();
    given.act_scale = wrong.get();
    EXPECT_EQ(field_of([&] { per_tensor.layer().set_weights(given); }), "weights.act_scale") << bad;
    std::swap(given.x_scale, given.act_scale);
    EXPECT_EQ(field_of([&] { per_tensor.layer().set_weights(given); }), "weights.x_scale") << bad;
    given.x_scale = good.get();
    given.act_scale = good.get();
    EXPECT_EQ(field_of([&] { per_tensor.layer().set_weights(given); }), "no error") << bad;
  }
  // BF16 takes no scales.
  MoEConfig b = c;
  b.experts.quant = QuantVariant::BF16;
  LayerRig bf16(b, 4, 1);
  EXPECT_EQ(field_of([&] { bf16.layer().set_weights(ok); }), "weights.w13_scale");
  // The mma path serves FP8 with its one kernel; the rule takes the others.
  MoEConfig mma = c;
  mma.options.backend = "mma";
  const std::string forced = MoELayer::create(mma, 4)->describe(1);
  EXPECT_EQ(forced.rfind("path=mma tile_m=128 gemm1=wg_m128n128 gemm2=wg_m128n128", 0), 0u) << forced;
  std::unique_ptr<MoELayer> layer = MoELayer::create(c, 4096);
  EXPECT_EQ(layer->describe(1).rfind("path=stream", 0), 0u) << layer->describe(1);
  EXPECT_EQ(layer->describe(4096).rfind("path=cutlass", 0), 0u) << layer->describe(4096);
}

}  // namespace
}  // namespace unimoe
