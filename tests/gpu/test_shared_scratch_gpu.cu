// Layers sharing one scratch (MoELayer::create with a scratch), as the MoE
// layers of a model do: each forward of one layer overwrites what another
// left there, and none may notice. Five layers of different variants and
// paths (BF16 by the rule and forced to cutlass, FP8PerTensor with dynamic
// scales on cutlass, FP8Block128 by the rule, MXFP4) share one buffer sized
// for the largest; each is checked against a layer of the same config and
// weights with buffers of its own: the same output bits for every layer
// after all have run, eager and replayed from one graph that captures all
// five, with fresh inputs and routing each time, outputs poisoned first;
// and against the CPU reference (relative L2 below 1e-2, the bound of the
// layer tests of each variant, plus FP8's near-tie allowance). create's
// checks of the scratch name the field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "gpu/layer_rig.h"
#include "ref/ref.h"
#include "ref/synthetic.h"
#include "support/presets.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;
using test::field_of;
using test::LayerRig;

constexpr double kTolerance = 1e-2;
constexpr int kMaxTokens = 160;

std::vector<MoEConfig> model_layers() {
  std::vector<MoEConfig> v;
  v.push_back(moe_config(RoutingPolicy::Renormalize, 16, 4, 512, 384));
  MoEConfig cutlass = moe_config(RoutingPolicy::Renormalize, 12, 3, 256, 128);
  cutlass.options.backend = "cutlass";
  v.push_back(cutlass);
  MoEConfig tensor = moe_config(RoutingPolicy::Renormalize, 32, 2, 256, 256);
  tensor.experts.quant = QuantVariant::FP8PerTensor;
  tensor.options.backend = "cutlass";
  v.push_back(tensor);
  MoEConfig block = moe_config(RoutingPolicy::Renormalize, 16, 4, 512, 384);
  block.experts.quant = QuantVariant::FP8Block128;
  v.push_back(block);
  MoEConfig mx = moe_config(RoutingPolicy::Renormalize, 8, 2, 256, 128);
  mx.experts.quant = QuantVariant::MXFP4;
  v.push_back(mx);
  return v;
}

std::size_t largest_scratch(const std::vector<MoEConfig>& configs) {
  std::size_t bytes = 0;
  for (const MoEConfig& c : configs) bytes = std::max(bytes, MoELayer::scratch_bytes(c, kMaxTokens));
  return bytes;
}

// One config's pair: the layer on the shared scratch and its twin with
// buffers of its own, on the same weights.
struct Pair {
  std::unique_ptr<LayerRig> shared, own;
};

std::vector<Pair> make_pairs(const std::vector<MoEConfig>& configs, const ScratchBuffer& scratch,
                             uint64_t seed) {
  std::vector<Pair> pairs;
  for (const MoEConfig& c : configs) {
    Pair p;
    p.shared = std::make_unique<LayerRig>(c, kMaxTokens, seed, false, nullptr, &scratch);
    p.own = std::make_unique<LayerRig>(c, kMaxTokens, seed);
    pairs.push_back(std::move(p));
  }
  return pairs;
}

// Fresh inputs (the same for both layers of a pair; outputs poisoned).
std::vector<std::vector<float>> load_all(std::vector<Pair>& pairs, int t, uint64_t seed) {
  std::vector<std::vector<float>> logits;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const MoEConfig& c = pairs[i].shared->config();
    logits.push_back(i % 2 == 0 ? ref::make_logits(c, t, seed + i, "uniform")
                                : test::hot_expert_logits(c, t, seed + i, int((seed + i) % c.routing.num_experts)));
    pairs[i].shared->load_inputs(t, seed ^ (0x51 + i), logits.back());
    pairs[i].own->load_inputs(t, seed ^ (0x51 + i), logits.back());
  }
  return logits;
}

// Runs every twin with buffers of its own, then checks that every shared
// layer's output bits equal its twin's and are within the bound of the
// reference.
void check_all(std::vector<Pair>& pairs, int t, const std::vector<std::vector<float>>& logits) {
  for (Pair& p : pairs) p.own->layer().forward(p.own->args(t), nullptr);
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    SCOPED_TRACE(pairs[i].shared->config().to_string() + " T=" + std::to_string(t));
    const std::vector<uint16_t> got = pairs[i].shared->output_bits(t);
    const std::vector<uint16_t> want = pairs[i].own->output_bits(t);
    std::size_t differ = 0;
    for (std::size_t j = 0; j < got.size(); ++j) differ += got[j] != want[j];
    EXPECT_EQ(differ, 0u) << "of " << got.size() << " output elements";
    const std::vector<float> ref_out = pairs[i].shared->reference(t, logits[i]);
    EXPECT_LT(pairs[i].shared->error_against(t, ref_out),
              kTolerance + pairs[i].shared->flip_allowance());
  }
}

// The five layers on one scratch sized for the largest, with their twins.
struct SharedModel {
  explicit SharedModel(uint64_t seed)
      : configs(model_layers()),
        buffer(largest_scratch(configs)),
        pairs(make_pairs(configs, ScratchBuffer{buffer.get(), buffer.size()}, seed)) {}
  std::vector<MoEConfig> configs;
  DeviceBuffer<char> buffer;
  std::vector<Pair> pairs;
};

TEST(SharedScratchGpu, LayersOfAModelMatchLayersWithBuffersOfTheirOwn) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  SharedModel model(seed);
  std::vector<Pair>& pairs = model.pairs;
  for (int t : {1, 37, kMaxTokens}) {
    // Every shared layer runs before any output is read: a layer that kept
    // something in the scratch from one forward to the next would read
    // another layer's data.
    std::vector<std::vector<float>> logits = load_all(pairs, t, seed + t);
    for (Pair& p : pairs) p.shared->layer().forward(p.shared->args(t), nullptr);
    check_all(pairs, t, logits);
    // Again in the other order, on fresh inputs.
    logits = load_all(pairs, t, seed + t + 1000);
    for (auto it = pairs.rbegin(); it != pairs.rend(); ++it)
      it->shared->layer().forward(it->shared->args(t), nullptr);
    check_all(pairs, t, logits);
  }
}

TEST(SharedScratchGpu, OneGraphOfAllLayersReplaysWithFreshRouting) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  SharedModel model(seed);
  std::vector<Pair>& pairs = model.pairs;
  const int t = 64;
  load_all(pairs, t, seed);
  cudaStream_t stream{};
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = test::capture(stream, cudaStreamCaptureModeThreadLocal, [&] {
    for (Pair& p : pairs) p.shared->layer().forward(p.shared->args(t), stream);
  });
  cudaGraphExec_t exec{};
  UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    const std::vector<std::vector<float>> logits = load_all(pairs, t, seed + 7 * (replay + 1));
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    check_all(pairs, t, logits);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}


TEST(SharedScratchGpu, CreateChecksTheScratch) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 16, 4, 512, 384);
  const std::size_t need = MoELayer::scratch_bytes(c, kMaxTokens);
  // At least the layer's own buffers: the routing result, the bf16
  // intermediate and GEMM2's rows for max_tokens * K rows.
  const std::size_t rows = std::size_t(kMaxTokens) * 4;
  EXPECT_GE(need, rows * (384 + 512) * 2);
  DeviceBuffer<char> buffer(need + 256);
  auto make = [&](void* p, std::size_t n) { return [&c, p, n] { MoELayer::create(c, kMaxTokens, p, n); }; };
  EXPECT_EQ(field_of(make(nullptr, need)), "scratch");
  EXPECT_EQ(field_of(make(buffer.get() + 16, need)), "scratch");
  EXPECT_EQ(field_of(make(buffer.get(), need - 1)), "scratch");
  std::vector<char> host(need + 256);
  char* host_aligned = host.data() + (256 - reinterpret_cast<std::uintptr_t>(host.data()) % 256) % 256;
  EXPECT_EQ(field_of(make(host_aligned, need)), "scratch");
  EXPECT_EQ(field_of(make(buffer.get(), need)), "no error");
  EXPECT_EQ(field_of(make(buffer.get() + 256, need)), "no error");
  // A bad config is refused before the scratch is looked at.
  MoEConfig bad = c;
  bad.routing.top_k = 0;
  EXPECT_EQ(field_of([&] { MoELayer::scratch_bytes(bad, kMaxTokens); }), "routing.top_k");
  EXPECT_EQ(field_of([&] { MoELayer::scratch_bytes(c, 0); }), "max_tokens");

  // The layer holds nothing per call of its own: BF16 has nothing that
  // persists; FP8PerTensor only its expanded weight scales and the folded
  // finalize's counters (one int per 8 columns of H).
  const std::unique_ptr<MoELayer> shared = MoELayer::create(c, kMaxTokens, buffer.get(), need);
  EXPECT_EQ(shared->workspace_bytes(), 0u);
  EXPECT_GE(MoELayer::create(c, kMaxTokens)->workspace_bytes(), rows * (384 + 512) * 2);
  c.experts.quant = QuantVariant::FP8PerTensor;
  DeviceBuffer<char> fp8_buffer(MoELayer::scratch_bytes(c, kMaxTokens));
  const std::unique_ptr<MoELayer> fp8 =
      MoELayer::create(c, kMaxTokens, fp8_buffer.get(), fp8_buffer.size());
  const std::size_t expanded = std::size_t(16) * ((2 * 384 / 128) * (512 / 128) + (512 / 128) * (384 / 128)) * 4;
  const std::size_t counters = 512 / 8 * 4;
  // One copy per FP8 backend the layer holds (stream, and cutlass where
  // the rule may take it).
  EXPECT_GE(fp8->workspace_bytes(), expanded + counters);
  EXPECT_LE(fp8->workspace_bytes(), 2 * expanded + counters);
  EXPECT_LT(fp8->workspace_bytes(), MoELayer::create(c, kMaxTokens)->workspace_bytes());
}

}  // namespace
}  // namespace unimoe
