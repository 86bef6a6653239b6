// The fused block and the cluster variant captured in a CUDA graph and
// replayed with new logits, and the layer with routing_variant "fused" and
// "cluster" against "split" (the same output bits).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/fused_routing_rig.h"
#include "gpu/gpu_test_util.h"
#include "gpu/layer_rig.h"
#include "support/presets.h"
#include "ref/ref.h"
#include "ref/synthetic.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;
using test::make_routing;
using Problem = test::RoutingProblem;
using Inputs = test::RoutingInputs;
using Outputs = test::RoutingOutputs;
using Rig = test::RoutingRig;

// Captures rig's fused block (cluster false) or cluster variant once and
// replays it three times, each with the logits make_logits(replay) gives
// (and `bias`): the outputs poisoned before each replay, then held to the
// reference and, bit for bit, to the split launches.
template <class MakeLogits>
void replay_with_new_logits(const Problem& pr, Rig& rig, bool cluster,
                            const std::vector<float>& bias, MakeLogits make_logits) {
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  graph = test::capture(stream, cudaStreamCaptureModeThreadLocal, [&] {
    if (cluster)
      rig.run_cluster(stream);
    else
      rig.run_fused(stream);
  });
  UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    const Inputs in = test::logits_inputs(pr, make_logits(replay), bias);
    rig.upload(in);
    rig.poison();
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());  // uploads and poison land before the replay
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    const Outputs got = rig.download();
    test::expect_matches_reference(pr, in, got);
    rig.poison();
    rig.run_split(nullptr);
    test::expect_identical(got, rig.download(), false);
  }
  UNIMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  UNIMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  UNIMOE_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(FusedRoutingGpu, GraphReplayWithNewLogits) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // T = 333 and T = 48 (the token masks at a decode size, here over an EP
  // range of 96 experts) with three tile sizes; T = 48 and T = 20 with one,
  // as the layer asks (the cluster kernel's token masks with K and the mask
  // words as constants: two words, then one).
  struct Case {
    int tokens;
    std::vector<int> tile_m;
  };
  const std::vector<int> three = {16, 64, 128};
  for (const Case& c : {Case{333, three}, Case{48, three}, Case{48, {16}}, Case{20, {16}}}) {
    const int t = c.tokens;
    SCOPED_TRACE("T=" + std::to_string(t) + ", tile sizes " + std::to_string(c.tile_m.size()));
    Problem pr{make_routing(RoutingPolicy::DeepSeekV3, 256, 8, LogitsType::F32, true), t, 32,
               t == 333 ? 128 : 96, c.tile_m};
    ASSERT_EQ(pr.config.n_group, 8);
    const std::size_t cells = static_cast<std::size_t>(t) * 256;
    const std::vector<float> bias = test::random_vector(256, rng, -0.2f, 0.2f);
    Rig rig(pr, test::logits_inputs(pr, std::vector<float>(cells, 0.0f), bias));
    for (const bool cluster : {false, true}) {
      SCOPED_TRACE(cluster ? "cluster variant" : "fused block");
      replay_with_new_logits(pr, rig, cluster, bias, [&](int replay) {
        // A different skew each time, so that the routing outcome really changes.
        std::vector<float> values = test::random_vector(cells, rng, -4, 4);
        for (std::size_t i = 0; i < values.size(); ++i)
          if (static_cast<int>(i % 256) / 32 == replay) values[i] += 2.0f;
        return values;
      });
    }
  }
}

// The cluster variant's smallest calls outside DeepSeek's policies: one
// routing CTA, launched as a cluster of 2 (routing_shape::
// cluster_of_two_for_one_cta), captured once and replayed with new logits.
TEST(FusedRoutingGpu, ClusterOfTwoGraphReplayWithNewLogits) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const RoutingPolicy policy : {RoutingPolicy::Renormalize, RoutingPolicy::TopK})
    for (const int t : {1, 2}) {
      Problem pr{make_routing(policy, 128, 8, LogitsType::F32, false), t, 0, 0};
      SCOPED_TRACE(pr.describe());
      const std::size_t cells = static_cast<std::size_t>(t) * 128;
      Rig rig(pr, test::logits_inputs(pr, std::vector<float>(cells, 0.0f), {}));
      replay_with_new_logits(pr, rig, true, {},
                             [&](int) { return test::random_vector(cells, rng, -4, 4); });
    }
}

std::vector<int32_t> download_counts(test::LayerRig& rig, int num_local) {
  std::vector<int32_t> counts(num_local);
  UNIMOE_CUDA_CHECK(
      cudaMemcpy(counts.data(), rig.impl().expert_counts(), num_local * 4, cudaMemcpyDeviceToHost));
  return counts;
}

TEST(FusedRoutingGpu, LayerVariantMatchesSplit) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 64, 8, 256, 128);
  c.experts.local_expert_offset = 16;
  c.experts.num_local_experts = 32;
  const int max_tokens = 600;  // T = 600 is 4800 rows: the fused layer falls back to split
  std::unique_ptr<test::LayerRig> fused, cluster, split;
  c.options.routing_variant = "fused";
  fused = std::make_unique<test::LayerRig>(c, max_tokens, seed);
  c.options.routing_variant = "cluster";
  cluster = std::make_unique<test::LayerRig>(c, max_tokens, seed);
  c.options.routing_variant = "split";
  split = std::make_unique<test::LayerRig>(c, max_tokens, seed);
  for (int t : {1, 7, 100, 512, 600}) {
    SCOPED_TRACE("T=" + std::to_string(t));
    const std::vector<float> logits = ref::make_logits(c, t, seed + t, "uniform");
    for (auto* rig : {fused.get(), cluster.get(), split.get()}) {
      rig->load_inputs(t, seed ^ 0xabc, logits);
      rig->layer().forward(rig->args(t), nullptr);
    }
    EXPECT_EQ(cluster->error(t, logits), split->error(t, logits));  // the same output bits
    EXPECT_EQ(download_counts(*cluster, 32), download_counts(*split, 32));
    const double fused_error = fused->error(t, logits), split_error = split->error(t, logits);
    EXPECT_LT(fused_error, test::kLayerTolerance);
    EXPECT_EQ(fused_error, split_error);  // deterministic stages: the same output bits
    EXPECT_EQ(download_counts(*fused, 32), download_counts(*split, 32));
  }
  // Precomputed ids and weights through the fused Routing stage.
  const int t = 77;
  const std::vector<float> logits = ref::make_logits(c, t, seed, "uniform");
  const ref::Routing routing = ref::route(c.routing, logits.data(), t, nullptr);
  DeviceBuffer<int32_t> ids(routing.ids);
  DeviceBuffer<float> weights(routing.weights);
  fused->load_inputs(t, seed ^ 0xdef, logits);
  ForwardArgs args = fused->args(t);
  args.logits = nullptr;
  args.topk_ids = ids.get();
  args.topk_weights = weights.get();
  fused->layer().forward(args, nullptr);
  EXPECT_LT(fused->error(t, logits, &routing), test::kLayerTolerance);

  c.options.routing_variant = "fast";
  EXPECT_THROW(test::LayerRig(c, 8, seed), Error);
}

}  // namespace
}  // namespace unimoe
