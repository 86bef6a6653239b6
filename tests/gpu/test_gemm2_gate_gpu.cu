// The two GEMM2 paths and the gate (plan/gemm2_gate.h,
// kernels/gemm/gemm2_combine.cuh) on the device: each forced path and the
// gated layer against the CPU reference (odd sizes, biases, an EP range,
// one hot expert, few experts, precomputed routing, K splits of few
// tiles); the combine path leaves the expert path's rows untouched; one
// captured graph takes both paths as the routing changes, asserted on the
// gate's device record; the output is the same bits on every run.
//
// Metric: relative L2 error < 1e-2 (test::kLayerTolerance). The combine
// path keeps GEMM2's products in fp32 where the expert path rounds y to
// bf16, so its error is, if anything, smaller.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "gpu/layer_rig.h"
#include "kernels/gemm/gemm2_combine.cuh"
#include "plan/gemm2_gate.h"
#include "ref/ref.h"
#include "support/presets.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;
using test::hot_expert_logits;
using test::LayerRig;
constexpr double kTolerance = test::kLayerTolerance;

std::vector<float> logits_of(const MoEConfig& c, int t, uint64_t seed, const std::string& kind) {
  if (kind == "hot") return hot_expert_logits(c, t, seed, int(seed % c.routing.num_experts));
  if (kind == "few") return test::few_experts_logits(c, t, seed, c.routing.top_k + 1);
  return ref::make_logits(c, t, seed, kind);
}

DevOverrides with_path(const char* path) {
  DevOverrides d;
  d.set(std::string("gemm2_path=") + path);
  return d;
}

Gemm2GateRecord read_record(LayerRig& rig) {
  Gemm2GateRecord r;
  UNIMOE_CUDA_CHECK(cudaMemcpy(&r, rig.impl().gemm2_gate_record(), sizeof r, cudaMemcpyDeviceToHost));
  return r;
}

// The gate's record is consistent with itself: one path's count is the
// schedule's, the other's 0, and the finalize runs exactly with the expert path.
void expect_consistent(const Gemm2GateRecord& r, int t, int top_k) {
  ASSERT_TRUE(r.path == 0 || r.path == 1) << r.path;
  const bool combine = r.path == static_cast<int>(Gemm2Path::Combine);
  EXPECT_EQ(r.combine_tiles, combine ? r.tiles : 0);
  EXPECT_EQ(r.expert_tiles, combine ? 0 : r.tiles);
  EXPECT_EQ(r.finalize, combine ? 0 : 1);
  EXPECT_GT(r.tiles, 0);
  EXPECT_LE(r.rows, t * top_k);
  EXPECT_LE(r.active, r.rows);
  EXPECT_GE(r.chunks, r.active);
}

// One fresh set of weights and inputs, run with each GEMM2 mode; every
// output against one reference.
void check_point(const MoEConfig& c, int t, const std::string& kind) {
  const uint64_t seed = test::fresh_seed();
  const std::vector<float> logits = logits_of(c, t, seed, kind);
  std::vector<float> want;
  for (const char* path : {"expert", "combine", "gate"}) {
    SCOPED_TRACE(c.to_string() + " T=" + std::to_string(t) + " " + kind + " gemm2_path=" + path +
                 " seed " + std::to_string(seed));
    const DevOverrides dev = with_path(path);
    LayerRig rig(c, t, seed, false, &dev);
    const LayerPlan plan = rig.impl().plan_for(t);
    ASSERT_EQ(plan.gemm2_mode, std::string(path) == "expert"    ? Gemm2Mode::Expert
                               : std::string(path) == "combine" ? Gemm2Mode::Combine
                                                                : Gemm2Mode::Gate)
        << plan.to_string();
    rig.load_inputs(t, seed ^ 0xabc, logits);
    rig.layer().forward(rig.args(t), nullptr);
    if (want.empty()) want = rig.reference(t, logits);
    EXPECT_LT(rig.error_against(t, want), kTolerance);
    if (plan.gemm2_mode == Gemm2Mode::Gate) expect_consistent(read_record(rig), t, c.routing.top_k);
  }
}

// A call none of whose rows is on this rank (every id off the EP range):
// every mode writes zeros over the poisoned output; the gate sends it to the
// expert path, whose finalize writes them.
TEST(Gemm2GateGpu, CallWithNoRowOnThisRankWritesZeros) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 64, 4, 136, 72);
  c.experts.local_expert_offset = 60;
  c.experts.num_local_experts = 4;
  c.experts.activation = Activation::SwiGLUOai;
  c.experts.has_bias = true;
  for (int t : {1, 5}) {
    std::vector<int32_t> host_ids(std::size_t(t) * 4);
    for (std::size_t i = 0; i < host_ids.size(); ++i) host_ids[i] = int32_t(i % 60);  // all off rank
    const DeviceBuffer<int32_t> ids(host_ids);
    const DeviceBuffer<float> weights(std::vector<float>(host_ids.size(), 0.25f));
    for (const char* path : {"expert", "combine", "gate"}) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(std::string(path) + " T=" + std::to_string(t) + " seed " + std::to_string(seed));
      const DevOverrides dev = with_path(path);
      LayerRig rig(c, t, seed, false, &dev);
      rig.load_inputs(t, seed, ref::make_logits(c, t, seed, "uniform"));
      ForwardArgs a = rig.args(t);
      a.topk_ids = ids.get();
      a.topk_weights = weights.get();
      rig.layer().forward(a, nullptr);
      for (uint16_t bits : rig.output_bits(t)) ASSERT_EQ(bits, 0) << "not a zero";
      if (std::string(path) == "gate") {
        const Gemm2GateRecord r = read_record(rig);
        EXPECT_EQ(r.tiles, 0);
        EXPECT_EQ(r.path, static_cast<int>(Gemm2Path::Expert));
        EXPECT_EQ(r.finalize, 1);
      }
    }
  }
}

TEST(Gemm2GateGpu, EachPathMatchesTheReferenceOnThePresets) {
  UNIMOE_REQUIRE_GPU();
  // Stream-path decode (16-row tiles) and mma-path calls of 16- to 48-row tiles.
  check_point(find_preset("dsv3-tp8").config, 1, "uniform");
  check_point(find_preset("dsv3-tp8").config, 8, "uniform");
  check_point(find_preset("qwen3-30b-a3b").config, 33, "uniform");
  check_point(find_preset("mixtral-8x7b").config, 1, "uniform");
  check_point(find_preset("mixtral-8x7b").config, 100, "uniform");
}

TEST(Gemm2GateGpu, OddSizesBiasesAndSkewedRouting) {
  UNIMOE_REQUIRE_GPU();
  // H = 136: the last CTA owns 8 of its 16 columns. I = 72: K tails.
  for (Activation act : {Activation::SwiGLU, Activation::SwiGLUOai}) {
    MoEConfig c = moe_config(RoutingPolicy::Renormalize, 12, 3, 136, 72);
    c.experts.activation = act;
    c.experts.has_bias = act == Activation::SwiGLUOai;
    for (int t : {1, 7, 50, 100}) check_point(c, t, "uniform");
  }
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 32, 4, 256, 192);
  for (int t : {1, 33, 256}) check_point(c, t, "hot");  // 256 x 4 = kCombineMaxRows
  for (int t : {3, 200}) check_point(c, t, "few");
  check_point(c, 150, "zipf:1.2");
}

TEST(Gemm2GateGpu, ExpertParallelRangeAndFewTilesSplittingK) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig ep = moe_config(RoutingPolicy::Renormalize, 64, 8, 256, 128);
  ep.experts.local_expert_offset = 16;
  ep.experts.num_local_experts = 16;
  for (int t : {1, 7, 120}) check_point(ep, t, "uniform");  // tokens with no local row get 0
  // E = 8, K = 2: one token makes 2 tiles (the combine splits I 4 ways), 3
  // tokens up to 6 (2 ways); I = 1000 is not a multiple of the split's slab.
  const MoEConfig few = moe_config(RoutingPolicy::Renormalize, 8, 2, 128, 1000);
  for (int t : {1, 2, 3}) check_point(few, t, "uniform");
  const MoEConfig one = moe_config(RoutingPolicy::Renormalize, 4, 1, 64, 96);  // K = 1
  check_point(one, 1, "uniform");
}

TEST(Gemm2GateGpu, PrecomputedRoutingThroughTheGate) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 32, 4, 256, 128);
  const int t = 77;
  const DevOverrides dev = with_path("gate");
  LayerRig rig(c, t, seed, false, &dev);
  EXPECT_LT(rig.precomputed_routing_error(t, seed), kTolerance);
}

// The combine path, forced or chosen by the gate, writes nothing of y.
TEST(Gemm2GateGpu, CombinePathLeavesTheExpertRowsPoisoned) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 32, 4, 256, 128);
  const int t = 40;
  for (const char* path : {"combine", "gate"}) {
    SCOPED_TRACE(path);
    const DevOverrides dev = with_path(path);
    LayerRig rig(c, t, seed, false, &dev);
    Gemm2GateModel combine_wins;  // zero costs, then the combine cheaper by 1 ns
    combine_wins.expert.base = 1.0f;
    rig.impl().set_gemm2_gate_model(combine_wins);
    const std::size_t y_bytes = std::size_t(t) * c.routing.top_k * c.experts.hidden * 2;
    UNIMOE_CUDA_CHECK(cudaMemset(rig.impl().gemm2_rows(), 0xa5, y_bytes));
    const std::vector<float> logits = ref::make_logits(c, t, seed, "uniform");
    rig.load_inputs(t, seed, logits);
    rig.layer().forward(rig.args(t), nullptr);
    EXPECT_LT(rig.error(t, logits), kTolerance);
    std::vector<unsigned char> y(y_bytes);
    UNIMOE_CUDA_CHECK(cudaMemcpy(y.data(), rig.impl().gemm2_rows(), y_bytes, cudaMemcpyDeviceToHost));
    std::size_t touched = 0;
    for (unsigned char b : y) touched += b != 0xa5;
    EXPECT_EQ(touched, 0u) << "bytes of y written by the combine path";
    if (std::string(path) == "gate") {
      EXPECT_EQ(read_record(rig).path, static_cast<int>(Gemm2Path::Combine));
    }
  }
}

// One graph, captured once, replayed under routing that moves the gate's
// choice: the test's model makes the choice turn on the number of active
// experts, the combine path when more than 8 are active.
TEST(Gemm2GateGpu, OneGraphTakesBothPathsAsTheRoutingChanges) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 64, 4, 256, 128);
  const int t = 48;
  const DevOverrides dev = with_path("gate");
  LayerRig rig(c, t, seed, false, &dev);
  ASSERT_EQ(rig.impl().plan_for(t).gemm2_mode, Gemm2Mode::Gate);
  Gemm2GateModel by_active;
  by_active.combine.base = 8.5f;
  by_active.combine.per_active = -1.0f;  // combine: 8.5 - active < 0 = expert
  rig.impl().set_gemm2_gate_model(by_active);
  rig.load_inputs(t, seed, ref::make_logits(c, t, seed, "uniform"));
  test::CapturedForward graph(rig.layer(), rig.args(t));
  struct Replay {
    const char* kind;
    Gemm2Path path;
  };
  // Uniform: about 60 of 64 active; few: K + 1 = 5 active; hot: one expert
  // in every token, the rest uniform (still many active).
  const Replay replays[] = {{"uniform", Gemm2Path::Combine}, {"few", Gemm2Path::Expert},
                            {"hot", Gemm2Path::Combine},     {"few", Gemm2Path::Expert},
                            {"uniform", Gemm2Path::Combine}};
  int i = 0;
  for (const Replay& r : replays) {
    SCOPED_TRACE(std::string("replay ") + std::to_string(i) + " " + r.kind);
    const std::vector<float> logits = logits_of(c, t, seed + 17 * ++i, r.kind);
    rig.load_inputs(t, seed + 100 + i, logits);
    graph.replay();
    const Gemm2GateRecord rec = read_record(rig);
    expect_consistent(rec, t, c.routing.top_k);
    EXPECT_EQ(rec.path, static_cast<int>(r.path)) << "active " << rec.active;
    EXPECT_LT(rig.error(t, logits), kTolerance);
  }
}

// The gated chain's tail (the combine kernel given the gate's finalize
// flag) runs the finalize where the gate chose the expert path and the
// combine where it chose that: the same bits as the expert path forced
// (GEMM2, then the finalize kernel) and as the combine path forced, on the
// stream and mma paths, with biases, eager and from one graph.
TEST(Gemm2GateGpu, GatedTailGivesEachForcedPathsBits) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 32, 4, 264, 136);
  c.experts.activation = Activation::SwiGLUOai;
  c.experts.has_bias = true;
  Gemm2GateModel always_expert;  // the combine dearer by 1 ns
  always_expert.combine.base = 1.0f;
  Gemm2GateModel always_combine;
  always_combine.expert.base = 1.0f;
  for (const char* backend : {"stream", "mma"}) {
    c.options.backend = backend;
    for (const bool combine : {false, true}) {
      SCOPED_TRACE(std::string(backend) + (combine ? " combine" : " expert"));
      const DevOverrides gate = with_path("gate"), forced = with_path(combine ? "combine" : "expert");
      const int max_t = 40;
      LayerRig gated(c, max_t, seed, false, &gate);
      LayerRig plain(c, max_t, seed, false, &forced);
      gated.impl().set_gemm2_gate_model(combine ? always_combine : always_expert);
      auto same = [&](int t, const std::vector<float>& logits, bool replayed) {
        plain.load_inputs(t, seed + t, logits);
        plain.layer().forward(plain.args(t), nullptr);
        EXPECT_EQ(gated.output_bits(t), plain.output_bits(t)) << "T=" << t << " replay " << replayed;
        EXPECT_EQ(read_record(gated).path,
                  static_cast<int>(combine ? Gemm2Path::Combine : Gemm2Path::Expert));
        EXPECT_LT(gated.error(t, logits), kTolerance);
      };
      for (int t : {1, 9, max_t}) {
        const std::vector<float> logits = ref::make_logits(c, t, seed + t, "uniform");
        gated.load_inputs(t, seed + t, logits);
        gated.layer().forward(gated.args(t), nullptr);
        same(t, logits, false);
      }
      gated.load_inputs(max_t, seed, ref::make_logits(c, max_t, seed, "uniform"));
      test::CapturedForward graph(gated.layer(), gated.args(max_t));
      for (int replay = 0; replay < 2; ++replay) {
        const std::vector<float> logits = logits_of(c, max_t, seed + 50 + replay, replay ? "hot" : "uniform");
        gated.load_inputs(max_t, seed + max_t, logits);
        graph.replay();
        same(max_t, logits, true);
      }
    }
  }
}

// The same input gives the same bits, on every path (no atomics; fixed
// summation orders).
TEST(Gemm2GateGpu, OutputIsBitwiseRepeatable) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 8, 2, 256, 512);
  for (int t : {1, 3, 64}) {
    for (const char* path : {"expert", "combine", "gate"}) {
      SCOPED_TRACE(std::string(path) + " T=" + std::to_string(t));
      const DevOverrides dev = with_path(path);
      LayerRig rig(c, t, seed, false, &dev);
      const std::vector<float> logits = ref::make_logits(c, t, seed, "uniform");
      std::vector<uint16_t> first;
      for (int run = 0; run < 3; ++run) {
        rig.load_inputs(t, seed, logits);  // poisons out
        rig.layer().forward(rig.args(t), nullptr);
        UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint16_t> bits(std::size_t(t) * c.experts.hidden);
        UNIMOE_CUDA_CHECK(cudaMemcpy(bits.data(), rig.args(t).out, bits.size() * 2,
                                     cudaMemcpyDeviceToHost));
        if (run == 0) first = bits;
        else EXPECT_EQ(std::memcmp(bits.data(), first.data(), bits.size() * 2), 0) << "run " << run;
      }
    }
  }
}

// The launchers refuse what their kernels cannot serve, naming the field,
// before launching anything.
template <typename Params, typename Launch>
void expect_refused(const Params& p, const std::string& words, Launch launch) {
  test::expect_refused<std::runtime_error>(p, words, launch);
}

TEST(Gemm2GateGpu, LaunchersRefuseBadArguments) {
  UNIMOE_REQUIRE_GPU();
  DeviceBuffer<uint16_t> act(64), w2(64), out(64);
  DeviceBuffer<int32_t> ints(64);
  DeviceBuffer<float> weights(64);
  DeviceBuffer<DeviceTile> tiles(4);
  DeviceBuffer<Gemm2GateRecord> record(1);
  CombineGemm2Params good;
  good.act = act.get();
  good.w2 = w2.get();
  good.tiles = tiles.get();
  good.num_tiles = ints.get();
  good.expanded_to_permuted = ints.get();
  good.topk_weights = weights.get();
  good.num_tokens = 2;
  good.top_k = 2;
  good.hidden = 16;
  good.intermediate = 8;
  good.out = out.get();
  const auto combine = [](const CombineGemm2Params& p) { launch_combine_gemm2(p, false, nullptr); };
  CombineGemm2Params p = good;
  p.num_tokens = kCombineMaxRows;  // x top_k 2: past the rows the slots hold
  expect_refused(p, "num_tokens x top_k is 2048; the combine path serves at most 1024", combine);
  p = good;
  p.hidden = 12;
  expect_refused(p, "hidden is 12", combine);
  p = good;
  p.intermediate = 0;
  expect_refused(p, "intermediate is 0", combine);
  p = good;
  p.top_k = 0;
  expect_refused(p, "top_k is 0", combine);
  p = good;
  p.num_tokens = -1;
  expect_refused(p, "num_tokens is -1", combine);
  p = good;
  p.topk_weights = nullptr;
  expect_refused(p, "is null", combine);

  Gemm2GateParams g;
  g.expert_counts = ints.get();
  g.num_local = 4;
  g.num_tiles = ints.get();
  g.record = record.get();
  const auto gate = [](const Gemm2GateParams& q) { launch_gemm2_gate(q, nullptr); };
  Gemm2GateParams q = g;
  q.num_local = 0;
  expect_refused(q, "num_local is 0", gate);
  q = g;
  q.record = nullptr;
  expect_refused(q, "is null", gate);
  q = g;
  q.forced = 2;
  expect_refused(q, "forced is 2", gate);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace unimoe
