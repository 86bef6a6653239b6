// The FP8 stream kernel's wide CTAs in the layer (two column blocks a CTA
// where that fits the grid in one wave: stream_gemm_fp8_config.h; knob
// fp8_wide_ctas): the dsv3-tp8 GEMM2 at T = 1 (8 tiles x 7168 columns,
// K = 256) takes them. With them and without, on every FP8 form (block 128,
// per tensor dynamic and static), the layer matches the CPU reference:
// from logits, and from precomputed routing with a repeated expert id (a
// two-row tile, which a wide CTA serves one row at a time); and in one
// graph replayed with fresh routing. The two forms add a pair's partial
// sums in different orders, so they are not compared with each other bit
// for bit. Fresh weights and inputs each run, output poisoned (LayerRig).
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

using test::LayerRig;

using Form = test::Fp8Form;
constexpr auto& kForms = test::kFp8Forms;

// dsv3-tp8 at T = 1 on the stream path, wide CTAs on or off.
MoEConfig dsv3_tp8(const Form& form) {
  MoEConfig c = find_preset("dsv3-tp8").config;
  c.experts.quant = form.quant;
  c.options.backend = "stream";
  return c;
}

TEST(Fp8WideCtasGpu, Dsv3Tp8DecodeWithAndWithoutThem) {
  UNIMOE_REQUIRE_GPU();
  for (const Form& form : kForms)
    for (const char* wide : {"fp8_wide_ctas=1", "fp8_wide_ctas=0"}) {
      const MoEConfig c = dsv3_tp8(form);
      DevOverrides dev;
      dev.set(wide);
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(std::string(form.name) + " " + wide + " seed " + std::to_string(seed));
      LayerRig rig(c, 1, seed, form.static_scales, &dev);
      EXPECT_NE(rig.layer().describe(1).find("path=stream"), std::string::npos);
      const std::vector<float> logits = ref::make_logits(c, 1, seed, "uniform");
      rig.load_inputs(1, seed, logits);
      rig.layer().forward(rig.args(1), nullptr);
      const double err = rig.error(1, logits);  // sets the flip allowance first
      EXPECT_LT(err, kFp8Tolerance + rig.flip_allowance());

      // Expert 5 twice: a two-row tile.
      const ref::Routing routing = test::repeated_expert_routing();
      rig.forward_routed(1, seed + 1, logits, routing);
      const double given_err = rig.error(1, logits, &routing);  // sets the flip allowance first
      EXPECT_LT(given_err, kFp8Tolerance + rig.flip_allowance());
    }
}

TEST(Fp8WideCtasGpu, GraphReplaysWithFreshRouting) {
  UNIMOE_REQUIRE_GPU();
  for (const Form& form : kForms) {
    const MoEConfig c = dsv3_tp8(form);
    const uint64_t seed = test::fresh_seed();
    LayerRig rig(c, 1, seed, form.static_scales);
    test::CapturedForward graph(rig.layer(), rig.args(1));
    for (int replay = 0; replay < 3; ++replay) {
      SCOPED_TRACE(std::string(form.name) + " replay " + std::to_string(replay) + " seed " +
                   std::to_string(seed));
      const std::vector<float> fresh = ref::make_logits(c, 1, seed + 7 * replay, "uniform");
      rig.load_inputs(1, seed + 100 + replay, fresh);
      graph.replay();
      const double err = rig.error(1, fresh);  // sets the flip allowance first
      EXPECT_LT(err, kFp8Tolerance + rig.flip_allowance());
    }
  }
}

}  // namespace
}  // namespace unimoe
