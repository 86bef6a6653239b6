// Two ways the decode chain loses kernels, each against the chain that keeps
// them (development knobs; plan/layer_plan.h):
//   - fp8_quant_in_gemm: at one token the FP8 stream GEMMs quantize x and
//     the activation themselves (stream_gemm_fp8.cuh, a_bf16 / a_f32) with
//     the quantize kernels' rule and code, so the layer gives the same bits
//     as with the quantize kernels, on every FP8 form;
//   - finalize_in_gemm2: the FP8 stream GEMM2 and the 4-bit 16-row GEMM2
//     fold the finalize into the CTA that completes each column block
//     (FinalizeFold, grouped_gemm.cuh) with the finalize kernel's arithmetic
//     (finalize_device.cuh), so the same bits as the finalize kernel.
// Each: eager at several T, then one graph replayed with fresh routing (a
// hot expert on the second replay), the output poisoned before each run
// (LayerRig), within the reference's bound; an EP range with off-rank rows
// and a call with no row on this rank (the fold's zeros); precomputed
// routing that repeats an expert (a two-row tile, which the GEMMs that
// quantize their own rows serve one row at a time).
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "gpu/layer_rig.h"
#include "plan/autotune.h"
#include "plan/layer_plan.h"
#include "plan/routing_plan.h"
#include "ref/ref.h"
#include "ref/synthetic.h"
#include "support/presets.h"

namespace unimoe {
namespace {

using test::LayerRig;

using Form = test::Fp8Form;
constexpr auto& kForms = test::kFp8Forms;
constexpr QuantVariant kW4Formats[] = {QuantVariant::MXFP4, QuantVariant::NVFP4};

DevOverrides knobs(const std::string& a, const std::string& b = "") {
  DevOverrides d;
  d.set(a);
  if (!b.empty()) d.set(b);
  return d;
}

// The plan takes the folds the test means to exercise at each T (so that a
// change of the rule cannot leave the comparisons below comparing the
// default chain with itself).
void expect_planned(const MoEConfig& c, const DevOverrides& dev, std::initializer_list<int> ts,
                    bool quantize) {
  for (int t : ts) {
    const LayerPlan p = plan_layer(c, t, false, RoutingDeviceCaps{}, dev);
    EXPECT_EQ(p.fp8_quant_in_gemm, quantize && t == 1) << "T=" << t;
    EXPECT_TRUE(p.finalize_in_gemm2 || dev.finalize_in_gemm2 == 0) << "T=" << t;
  }
}

MoEConfig stream_config(const char* preset, QuantVariant q) {
  MoEConfig c = find_preset(preset).config;
  c.experts.quant = q;
  c.options.backend = "stream";
  return c;
}

TEST(DecodeFoldsGpu, Fp8GemmsQuantizingTheirInputGiveTheQuantizeKernelsBits) {
  UNIMOE_REQUIRE_GPU();
  for (const char* preset : {"dsv3-tp8", "qwen3-30b-a3b"})
    for (const Form& form : kForms) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(std::string(preset) + " " + form.name + " seed " + std::to_string(seed));
      const MoEConfig c = stream_config(preset, form.quant);
      const DevOverrides fused = knobs("fp8_quant_in_gemm=1");
      expect_planned(c, fused, {1}, true);
      test::expect_same_bits(c, seed, form.static_scales, fused, DevOverrides{}, {1}, 1,
                             kFp8Tolerance, 5);
      // Both folds together against neither.
      const DevOverrides both = knobs("fp8_quant_in_gemm=1", "finalize_in_gemm2=1");
      expect_planned(c, both, {1}, true);
      test::expect_same_bits(c, seed + 1, form.static_scales, both, DevOverrides{}, {1}, 1,
                             kFp8Tolerance, 5);
    }
}

TEST(DecodeFoldsGpu, FoldedFinalizeGivesTheFinalizeKernelsBits) {
  UNIMOE_REQUIRE_GPU();
  const DevOverrides fold = knobs("finalize_in_gemm2=16");
  for (const Form& form : kForms) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(std::string(form.name) + " seed " + std::to_string(seed));
    expect_planned(stream_config("qwen3-30b-a3b", form.quant), fold, {1, 3, 16}, false);
    test::expect_same_bits(stream_config("qwen3-30b-a3b", form.quant), seed, form.static_scales,
                           fold, DevOverrides{}, {1, 3, 16}, 8, kFp8Tolerance, 5);
    // I = 384, E = 16: two- and three-row tiles at these T; K blocks of 3.
    MoEConfig small = moe_config(RoutingPolicy::Renormalize, 16, 4, 512, 384);
    small.experts.quant = form.quant;
    small.options.backend = "stream";
    test::expect_same_bits(small, seed + 1, form.static_scales, fold, DevOverrides{}, {1, 7, 16},
                           16, kFp8Tolerance, 3);
  }
  for (QuantVariant q : kW4Formats) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(to_string(q) + " seed " + std::to_string(seed));
    expect_planned(stream_config("gpt-oss-120b", q), fold, {1, 4, 16}, false);
    test::expect_same_bits(stream_config("gpt-oss-120b", q), seed, false, fold, DevOverrides{},
                           {1, 4, 16}, 8, kTuningTolerance, 5);
    MoEConfig odd = moe_config(RoutingPolicy::Renormalize, 7, 3, 160, 96);  // K and N tails
    odd.experts.quant = q;
    odd.experts.activation = Activation::SwiGLUOai;
    odd.experts.swiglu_alpha = 1.702f;
    odd.experts.swiglu_limit = 7.0f;
    odd.experts.has_bias = true;  // b2 in GEMM2's epilogue, before the fold
    test::expect_same_bits(odd, seed + 1, false, fold, DevOverrides{}, {1, 5, 16}, 5,
                           kTuningTolerance, 2);
  }
}

// An EP range: off-rank rows skipped, tokens with no local row zero, and a
// call none of whose rows is local (no tile: GEMM2's CTA 0 writes the
// zeros). Both knobs, every FP8 form and both 4-bit formats.
TEST(DecodeFoldsGpu, ExpertParallelRangeAndACallWithNoLocalRow) {
  UNIMOE_REQUIRE_GPU();
  std::vector<QuantVariant> variants = {QuantVariant::FP8Block128, QuantVariant::FP8PerTensor};
  variants.insert(variants.end(), std::begin(kW4Formats), std::end(kW4Formats));
  for (QuantVariant q : variants) {
    MoEConfig c = moe_config(RoutingPolicy::Renormalize, 64, 4, 256, 128);
    c.experts.quant = q;
    c.experts.local_expert_offset = 16;
    c.experts.num_local_experts = 16;
    c.options.backend = "stream";
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(to_string(q) + " seed " + std::to_string(seed));
    const double tolerance = q == QuantVariant::MXFP4 || q == QuantVariant::NVFP4 ? kTuningTolerance
                                                                                    : kFp8Tolerance;
    const DevOverrides both = knobs("fp8_quant_in_gemm=1", "finalize_in_gemm2=16");
    const bool fp8 = q == QuantVariant::FP8Block128 || q == QuantVariant::FP8PerTensor;
    expect_planned(c, both, {1, 7, 16}, fp8);
    test::expect_same_bits(c, seed, false, both, DevOverrides{}, {1, 7, 16}, 16, tolerance, 20);

    LayerRig rig(c, 4, seed, false, &both);
    const std::vector<int32_t> ids = {0, 5, 40, 63, 1, 2, 3, 4, 50, 51, 52, 53, 15, 32, 48, 60};
    for (int t : {1, 4}) {
      SCOPED_TRACE("T=" + std::to_string(t) + ", every id off this rank's range [16, 32)");
      rig.forward_routed(t, seed + t, ref::make_logits(c, t, seed, "uniform"),
                         test::given_routing(t, c.routing.top_k, ids, 0.25f));
      for (uint16_t bits : rig.output_bits(t)) ASSERT_EQ(bits, 0u);
    }
  }
}

// Precomputed routing that repeats an expert at one token: a two-row tile,
// which the FP8 GEMMs quantizing their own rows serve a row at a time (not
// the multi-row path: these bits differ from the default chain's in the
// order of the sums, so the check is against the reference).
TEST(DecodeFoldsGpu, RepeatedExpertAtOneTokenAgainstTheReference) {
  UNIMOE_REQUIRE_GPU();
  for (const Form& form : kForms) {
    const MoEConfig c = stream_config("dsv3-tp8", form.quant);
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(std::string(form.name) + " seed " + std::to_string(seed));
    const DevOverrides both = knobs("fp8_quant_in_gemm=1", "finalize_in_gemm2=1");
    LayerRig rig(c, 1, seed, form.static_scales, &both);
    const ref::Routing routing = test::repeated_expert_routing();
    const std::vector<float> logits = ref::make_logits(c, 1, seed, "uniform");
    rig.forward_routed(1, seed + 1, logits, routing);
    const double err = rig.error(1, logits, &routing);  // sets the flip allowance first
    EXPECT_LT(err, kFp8Tolerance + rig.flip_allowance());
  }
}

}  // namespace
}  // namespace unimoe
