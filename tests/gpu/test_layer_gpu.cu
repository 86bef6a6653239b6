// The whole BF16 layer on the device (routing, permute, GEMM1, GEMM2,
// finalize) against the CPU reference: fresh random inputs each run, output
// poisoned before each run, odd sizes, skewed and degenerate routing, an EP
// local range, precomputed routing, and CUDA-graph replay with routing that
// changes every replay.
//
// Metric: relative L2 error of the whole output < 1e-2. Operands are bf16
// with fp32 accumulation; the activated intermediate and y are rounded to bf16
// on the device (the reference rounds the intermediate only) and out is
// rounded to bf16: expected errors are a few 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "core/hash_random.h"
#include "gpu/gpu_test_util.h"
#include "kernels/fill.cuh"
#include "plan/presets.h"
#include "ref/ref.h"
#include "ref/synthetic.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;
constexpr double kTolerance = 1e-2;

// A layer with synthetic weights that the host can regenerate.
class LayerRig {
 public:
  LayerRig(const MoEConfig& c, int max_tokens, uint64_t seed)
      : c_(c), seeds_(ref::seeds_for(seed)), host_weights_(c, seeds_) {
    const std::size_t e = c.local_experts(), h = c.experts.hidden, i = c.experts.intermediate;
    const std::size_t n1 = c.gemm1_cols();
    w13_ = DeviceBuffer<uint16_t>(e * n1 * h);
    w2_ = DeviceBuffer<uint16_t>(e * h * i);
    launch_fill_bf16(w13_.get(), w13_.size(), seeds_.w13, ref::w13_scale(c), nullptr);
    launch_fill_bf16(w2_.get(), w2_.size(), seeds_.w2, ref::w2_scale(c), nullptr);
    ExpertWeights w{w13_.get(), w2_.get(), nullptr, nullptr};
    if (c.experts.has_bias) {
      b13_ = DeviceBuffer<float>(e * n1);
      b2_ = DeviceBuffer<float>(e * h);
      launch_fill_f32(b13_.get(), b13_.size(), seeds_.b13, ref::kBiasScale, nullptr);
      launch_fill_f32(b2_.get(), b2_.size(), seeds_.b2, ref::kBiasScale, nullptr);
      w.b13 = b13_.get();
      w.b2 = b2_.get();
    }
    bias_host_ = ref::host_bias(c, seeds_);
    bias_ = DeviceBuffer<float>(bias_host_);
    layer_ = MoELayer::create(c, max_tokens);
    layer_->set_weights(w);
    x_ = DeviceBuffer<uint16_t>(std::size_t(max_tokens) * h);
    logits_ = DeviceBuffer<float>(std::size_t(max_tokens) * c.routing.num_experts);
    out_ = DeviceBuffer<uint16_t>(std::size_t(max_tokens) * h);
  }

  // Args for T tokens over this rig's buffers.
  ForwardArgs args(int t) {
    ForwardArgs a;
    a.num_tokens = t;
    a.x = x_.get();
    a.logits = logits_.get();
    a.routing_bias = c_.routing.has_bias ? bias_.get() : nullptr;
    a.out = out_.get();
    return a;
  }

  // New x (from `x_seed`) and the given logits into the input buffers; out poisoned.
  void load_inputs(int t, uint64_t x_seed, const std::vector<float>& logits) {
    seeds_.x = x_seed;
    launch_fill_bf16(x_.get(), std::size_t(t) * c_.experts.hidden, x_seed, ref::kXScale, nullptr);
    UNIMOE_CUDA_CHECK(cudaMemcpy(logits_.get(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    out_.poison();
  }

  // Relative L2 error of the device output against the reference for the
  // routing the reference computes from `logits` (or the given routing).
  double error(int t, const std::vector<float>& logits, const ref::Routing* given = nullptr) {
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> bits = out_.download();
    std::vector<float> got(std::size_t(t) * c_.experts.hidden);
    for (std::size_t j = 0; j < got.size(); ++j) got[j] = ref::bf16_to_f32(bits[j]);
    const ref::Routing routing =
        given ? *given
              : ref::route(c_.routing, logits.data(), t, c_.routing.has_bias ? bias_host_.data() : nullptr);
    const std::vector<float> x = ref::host_x(c_, t, seeds_);
    const std::vector<float> want = ref::moe_forward(c_, host_weights_.source(), x.data(), routing);
    return test::rel_l2(got, want);
  }

  MoELayer& layer() { return *layer_; }

 private:
  MoEConfig c_;
  ref::Seeds seeds_;
  ref::HostWeights host_weights_;
  DeviceBuffer<uint16_t> w13_, w2_, x_, out_;
  DeviceBuffer<float> b13_, b2_, bias_, logits_;
  std::vector<float> bias_host_;
  std::unique_ptr<MoELayer> layer_;
};

// Logits that send every token to `hot` first (then K-1 others at random).
std::vector<float> hot_expert_logits(const MoEConfig& c, int t, uint64_t seed, int hot) {
  std::vector<float> l = ref::make_logits(c, t, seed, "uniform");
  for (int r = 0; r < t; ++r) l[std::size_t(r) * c.routing.num_experts + hot] += 100.0f;
  return l;
}

// Logits under which only experts [0, live) are ever chosen.
std::vector<float> few_experts_logits(const MoEConfig& c, int t, uint64_t seed, int live) {
  std::vector<float> l = ref::make_logits(c, t, seed, "uniform");
  for (int r = 0; r < t; ++r)
    for (int e = live; e < c.routing.num_experts; ++e) l[std::size_t(r) * c.routing.num_experts + e] -= 50.0f;
  return l;
}

// Both experts paths serve every point.
constexpr const char* kBackends[] = {"mma", "cutlass"};

void check_point(MoEConfig c, int t, const std::string& kind) {
  for (const char* backend : kBackends) {
    c.options.backend = backend;
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(c.to_string() + " T=" + std::to_string(t) + " " + kind + " seed " + std::to_string(seed));
    LayerRig rig(c, t, seed);
    std::vector<float> logits;
    if (kind == "hot") logits = hot_expert_logits(c, t, seed, int(seed % c.routing.num_experts));
    else if (kind == "few") logits = few_experts_logits(c, t, seed, c.routing.top_k + 1);
    else logits = ref::make_logits(c, t, seed, kind);
    rig.load_inputs(t, seed ^ 0xabc, logits);
    rig.layer().forward(rig.args(t), nullptr);
    EXPECT_LT(rig.error(t, logits), kTolerance);
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
    for (int t : {1, 7, 100}) check_point(c, t, "uniform");
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
  const std::vector<float> logits = ref::make_logits(c, t, seed, "uniform");
  ref::Routing routing = ref::route(c.routing, logits.data(), t, nullptr);
  for (float& w : routing.weights) w *= 0.5f;  // not what the logits would give
  DeviceBuffer<int32_t> ids(routing.ids);
  DeviceBuffer<float> weights(routing.weights);
  rig.load_inputs(t, seed, logits);
  ForwardArgs a = rig.args(t);
  a.logits = nullptr;
  a.topk_ids = ids.get();
  a.topk_weights = weights.get();
  rig.layer().forward(a, nullptr);
  EXPECT_LT(rig.error(t, logits, &routing), kTolerance);
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
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  rig.load_inputs(t, seed, ref::make_logits(c, t, seed, "uniform"));
  cudaGraph_t graph;
  UNIMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  rig.layer().forward(rig.args(t), stream);
  UNIMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    const std::vector<float> logits =
        replay == 1 ? hot_expert_logits(c, t, seed + replay, 5) : ref::make_logits(c, t, seed + replay, "uniform");
    rig.load_inputs(t, seed + 100 + replay, logits);
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_LT(rig.error(t, logits), kTolerance);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
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
  MoEConfig bad = c;
  bad.routing.top_k = 9;
  EXPECT_THROW(MoELayer::create(bad, 4), Error);
}

}  // namespace
}  // namespace unimoe
