// The whole BF16 layer on the device (routing, permute, GEMM1, GEMM2,
// finalize) against the CPU reference: fresh random inputs each run, output
// poisoned before each run, odd sizes, skewed and degenerate routing, an EP
// local range, precomputed routing, and CUDA-graph replay with routing that
// changes every replay.
//
// Metric: relative L2 error of the whole output < 1e-2 (test::kLayerTolerance,
// gpu/layer_rig.h, says why).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "core/hash_random.h"
#include "gpu/gpu_test_util.h"
#include "gpu/layer_rig.h"
#include "kernels/common/fill.cuh"
#include "support/presets.h"
#include "ref/ref.h"
#include "ref/synthetic.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;
using test::few_experts_logits;
using test::hot_expert_logits;
using test::LayerRig;
constexpr double kTolerance = test::kLayerTolerance;

// Every backend serves every point (the stream kernel too, though it is
// built for decode).
constexpr const char* kBackends[] = {"mma", "cutlass", "stream"};

// One fresh set of weights and inputs per point, run by every backend and
// compared with one reference output (the reference is most of the time).
void check_point(MoEConfig c, int t, const std::string& kind) {
  const uint64_t seed = test::fresh_seed();
  std::vector<float> logits;
  if (kind == "hot") logits = hot_expert_logits(c, t, seed, int(seed % c.routing.num_experts));
  else if (kind == "few") logits = few_experts_logits(c, t, seed, c.routing.top_k + 1);
  else logits = ref::make_logits(c, t, seed, kind);
  std::vector<float> want;
  for (const char* backend : kBackends) {
    c.options.backend = backend;
    SCOPED_TRACE(c.to_string() + " T=" + std::to_string(t) + " " + kind + " seed " + std::to_string(seed));
    LayerRig rig(c, t, seed);
    rig.load_inputs(t, seed ^ 0xabc, logits);
    rig.layer().forward(rig.args(t), nullptr);
    if (want.empty()) want = rig.reference(t, logits);
    EXPECT_LT(rig.error_against(t, want), kTolerance);
  }
}

TEST(LayerGpu, AnchorShapesAtSmallT) {
  UNIMOE_REQUIRE_GPU();
  for (const char* name : {"mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "dsv3-tp8", "gpt-oss-120b"})
    for (int t : {1, 3, 8}) check_point(find_preset(name).config, t, "uniform");
}

TEST(LayerGpu, TokenCountsOnQwen3) {
  UNIMOE_REQUIRE_GPU();
  const MoEConfig c = find_preset("qwen3-30b-a3b").config;
  for (int t : {1, 2, 3, 7, 33, 100, 1000}) check_point(c, t, "uniform");
}

TEST(LayerGpu, OddSizesAndEveryActivation) {
  UNIMOE_REQUIRE_GPU();
  for (Activation act : {Activation::SwiGLU, Activation::GeGLU, Activation::ReLU2, Activation::SwiGLUOai}) {
    MoEConfig c = moe_config(RoutingPolicy::Renormalize, 12, 3, 136, 72);
    c.experts.activation = act;
    c.experts.has_bias = act == Activation::SwiGLUOai;
    // Rows per expert T * 3 / 12: the mma backend's rule takes 16-row tiles
    // at T = 1 and 7, 32-row tiles (GEMM2 on m32n64x5) at 50, 48-row tiles
    // at 100.
    for (int t : {1, 7, 50, 100}) check_point(c, t, "uniform");
  }
}

TEST(LayerGpu, DeepSeekRoutingAndDefaultPolicy) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig ds = find_preset("dsv3-tp8").config;
  ds.experts.hidden = 512;
  check_point(ds, 33, "uniform");
  check_point(moe_config(RoutingPolicy::Default, 64, 6, 256, 128), 50, "uniform");
}

TEST(LayerGpu, OneHotExpertTakesEveryToken) {
  UNIMOE_REQUIRE_GPU();
  for (int t : {1, 33, 1000}) check_point(moe_config(RoutingPolicy::Renormalize, 32, 4, 256, 192), t, "hot");
}

TEST(LayerGpu, MostExpertsEmpty) {
  UNIMOE_REQUIRE_GPU();
  for (int t : {3, 200}) check_point(moe_config(RoutingPolicy::Renormalize, 128, 8, 256, 128), t, "few");
  check_point(moe_config(RoutingPolicy::Renormalize, 128, 8, 256, 128), 500, "skewed");
}

TEST(LayerGpu, ExpertParallelRangeDropsOffRankRows) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 64, 8, 256, 128);
  c.experts.local_expert_offset = 16;
  c.experts.num_local_experts = 16;
  for (int t : {1, 7, 300}) check_point(c, t, "uniform");
}

TEST(LayerGpu, PrecomputedRouting) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 32, 4, 256, 128);
  const int t = 77;
  LayerRig rig(c, t, seed);
  EXPECT_LT(rig.precomputed_routing_error(t, seed), kTolerance);
}

// The cutlass path's scatter of x rows (row_scatter, the default) and its
// gather (row_scatter=0) fill the same permuted rows: the same output bits,
// within the reference's bound, eager at T = 1, 33 and 300 with an EP range
// (off-rank rows skipped), and replayed from one graph with fresh routing
// (a hot expert on the second replay).
TEST(LayerGpu, RowScatterGivesTheGathersBits) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 64, 6, 264, 136);
  c.experts.local_expert_offset = 8;
  c.experts.num_local_experts = 40;
  c.options.backend = "cutlass";
  DevOverrides gather;
  gather.set("row_scatter=0");
  test::expect_same_bits(c, seed, false, DevOverrides{}, gather, {1, 33, 300}, 64, kTolerance, 20);
}

class LayerGraphGpu : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Backends, LayerGraphGpu, ::testing::ValuesIn(kBackends));

TEST_P(LayerGraphGpu, CapturedOnceReplaysWithFreshRouting) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(std::string(GetParam()) + " seed " + std::to_string(seed));
  MoEConfig c = find_preset("qwen3-30b-a3b").config;
  c.options.backend = GetParam();
  const int t = 37;
  LayerRig rig(c, t, seed);
  rig.load_inputs(t, seed, ref::make_logits(c, t, seed, "uniform"));
  test::CapturedForward graph(rig.layer(), rig.args(t));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    const std::vector<float> logits =
        replay == 1 ? hot_expert_logits(c, t, seed + replay, 5) : ref::make_logits(c, t, seed + replay, "uniform");
    rig.load_inputs(t, seed + 100 + replay, logits);
    graph.replay();
    EXPECT_LT(rig.error(t, logits), kTolerance);
  }
}

TEST(LayerGpu, DescribesWhatServesACallAndItsWorkspace) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig c = find_preset("dsv3-tp8").config;
  std::unique_ptr<MoELayer> small = MoELayer::create(c, 8);
  // The rule at T=1 (src/plan/layer_plan.cpp): stream backend, the cluster
  // routing variant, which launches the fused block itself for one token,
  // there with DeepSeek-V3's fixed choice (src/plan/routing_plan.cpp).
  EXPECT_EQ(small->describe(1),
            "path=stream tile_m=16 gemm1=stream_m16 gemm2=stream_m16 routing=cluster kernel=block "
            "ctas=1 threads=256 slots=8 select=fixed");
  // Workspace: at least the routing outputs, the intermediate and y rows.
  const std::size_t rows = 8 * 8;
  EXPECT_GE(small->workspace_bytes(), rows * (c.experts.intermediate + c.experts.hidden) * 2);
  // A layer whose largest call takes the CUTLASS backend also holds its buffers.
  std::unique_ptr<MoELayer> large = MoELayer::create(c, 4096);
  EXPECT_EQ(large->describe(4096).rfind("path=cutlass", 0), 0u) << large->describe(4096);
  EXPECT_GE(large->workspace_bytes(), std::size_t(4096) * 8 * c.experts.hidden * 2 * 2);
}

TEST(LayerGpu, RefusesBadCallsWithClearErrors) {
  UNIMOE_REQUIRE_GPU();
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 8, 2, 64, 64);
  LayerRig rig(c, 4, 1);
  ForwardArgs a = rig.args(5);
  EXPECT_THROW(rig.layer().forward(a, nullptr), Error);  // T above max_tokens
  a = rig.args(2);
  a.logits = nullptr;
  EXPECT_THROW(rig.layer().forward(a, nullptr), Error);  // no logits, no precomputed ids
  // Misaligned pointers are refused before a kernel could fault on them.
  auto field_of = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return e.field();
    }
    return std::string("no error");
  };
  a = rig.args(2);
  a.x = static_cast<const uint16_t*>(a.x) + 1;
  EXPECT_EQ(field_of([&] { rig.layer().forward(a, nullptr); }), "args.x");
  a = rig.args(2);
  a.logits = static_cast<const char*>(a.logits) + 2;
  EXPECT_EQ(field_of([&] { rig.layer().forward(a, nullptr); }), "args.logits");
  DeviceBuffer<uint16_t> w(64);
  EXPECT_EQ(field_of([&] { rig.layer().set_weights({w.get() + 4, w.get(), nullptr, nullptr}); }),
            "weights.w13");
  MoEConfig bad = c;
  bad.routing.top_k = 9;
  EXPECT_THROW(MoELayer::create(bad, 4), Error);
}

}  // namespace
}  // namespace unimoe
