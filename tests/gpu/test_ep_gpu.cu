// The expert-parallel layer on one GPU: W ranks in one process over the
// loopback transport (and a group of one over NCCL where NCCL loads), each
// rank with its slice of one model's experts, against the single-GPU layer
// on the same weights and against the CPU reference. Fresh random inputs,
// poisoned outputs, uniform, one-hot and confined routing, every policy
// family, BF16, gpt-oss-style biases and FP8Block128, empty calls, and one
// CUDA graph of every rank's steps replayed with fresh routing.
//
// Metric: relative L2 error < 1e-2 (test::kLayerTolerance) against the
// reference and against the single-GPU layer; bitwise equal to the
// single-GPU layer where each token's experts sit on one rank and both
// layers run the same GEMM tactic (the partial sum is the finalize's sum,
// and the combine adds it to -0).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "gpu/layer_rig.h"
#include "layer/ep_layer.h"
#include "layer/nccl_runtime.h"
#include "ref/ep.h"
#include "ref/ref.h"
#include "ref/synthetic.h"
#include "unimoe/ep.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;

MoEConfig bf16_config(RoutingPolicy policy, int experts, int top_k) {
  MoEConfig c;
  c.routing.policy = policy;
  c.routing.num_experts = experts;
  c.routing.top_k = top_k;
  c.experts.hidden = 128;
  c.experts.intermediate = 64;
  return c;
}

// The model's layer (a LayerRig over W * cap tokens) and W EP ranks over
// the loopback transport. Rank r's tokens are rows [r * cap, r * cap + t)
// of the rig's inputs, and its output goes to the same rows of out_. With
// `scratch` (one buffer a rank, scratch_bytes each) the ranks are made with
// EPLayer::create's shared-scratch form, the environment's overrides.
class EPRig {
 public:
  EPRig(const MoEConfig& c, int world, int cap, uint64_t seed, const DevOverrides& dev = {},
        const std::vector<void*>& scratch = {}, std::size_t scratch_bytes = 0)
      : c_(c), world_(world), cap_(cap), single_(c, world * cap, seed, false, &dev),
        transports_(make_loopback_transports(world)),
        out_(std::size_t(world) * cap * c.experts.hidden) {
    for (int r = 0; r < world; ++r) {
      ranks_.push_back(scratch.empty()
                           ? ep_access::create(c, cap, *transports_[r], dev)
                           : EPLayer::create(c, cap, *transports_[r], scratch[r], scratch_bytes));
      const int per_rank = c.routing.num_experts / world;
      ranks_.back()->set_weights(slice_experts(single_.device_weights(), c, r * per_rank, per_rank));
    }
  }

  // Rank r's call of t tokens; with ids and weights ([W * cap, K]) the
  // rank's rows of them as precomputed routing.
  ForwardArgs rank_args(int r, int t, const int32_t* ids = nullptr, const float* weights = nullptr) const {
    const ForwardArgs all = single_.args(world_ * cap_);
    const std::size_t h = c_.experts.hidden, e = c_.routing.num_experts, k = c_.routing.top_k;
    ForwardArgs a = all;
    a.num_tokens = t;
    a.x = static_cast<const uint16_t*>(all.x) + std::size_t(r) * cap_ * h;
    a.logits = static_cast<const float*>(all.logits) + std::size_t(r) * cap_ * e;
    if (ids) {
      a.topk_ids = ids + std::size_t(r) * cap_ * k;
      a.topk_weights = weights + std::size_t(r) * cap_ * k;
    }
    a.out = out_.get() + std::size_t(r) * cap_ * h;
    return a;
  }

  // New inputs for every rank's cap tokens; both outputs poisoned.
  void load(uint64_t seed, const std::vector<float>& logits) {
    logits_ = logits;
    single_.load_inputs(world_ * cap_, seed, logits);
    out_.poison();
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // Every rank's call of t tokens, step by step in lockstep.
  void run(int t, cudaStream_t stream = nullptr, const int32_t* ids = nullptr, const float* weights = nullptr) {
    for (EPLayer::Step s : kEPSteps)
      for (int r = 0; r < world_; ++r) ranks_[r]->run_step(s, rank_args(r, t, ids, weights), stream);
  }

  // The single-GPU layer on all W * cap tokens (with the given routing, if
  // any), and its output.
  std::vector<uint16_t> single_output(const int32_t* ids = nullptr, const float* weights = nullptr) {
    ForwardArgs a = single_.args(world_ * cap_);
    a.topk_ids = ids;
    a.topk_weights = weights;
    single_.layer().forward(a, nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    return single_out_bits();
  }
  std::vector<uint16_t> ep_output() {
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    return out_.download();
  }
  std::vector<float> reference() { return single_.reference(world_ * cap_, logits_); }

  // Rows [r * cap, r * cap + t) of each rank, as floats.
  std::vector<float> rows(const std::vector<uint16_t>& bits, int t) const {
    std::vector<float> v;
    const std::size_t h = c_.experts.hidden;
    for (int r = 0; r < world_; ++r)
      for (std::size_t j = std::size_t(r) * cap_ * h; j < (std::size_t(r) * cap_ + t) * h; ++j)
        v.push_back(ref::bf16_to_f32(bits[j]));
    return v;
  }
  std::vector<float> rows(const std::vector<float>& values, int t) const {
    std::vector<float> v;
    const std::size_t h = c_.experts.hidden;
    for (int r = 0; r < world_; ++r)
      for (std::size_t j = std::size_t(r) * cap_ * h; j < (std::size_t(r) * cap_ + t) * h; ++j)
        v.push_back(values[j]);
    return v;
  }

  EPLayer& rank(int r) { return *ranks_[r]; }
  const MoEConfig& config() const { return c_; }
  int world() const { return world_; }
  int cap() const { return cap_; }

 private:
  std::vector<uint16_t> single_out_bits() {
    const ForwardArgs a = single_.args(world_ * cap_);
    std::vector<uint16_t> bits(std::size_t(world_) * cap_ * c_.experts.hidden);
    UNIMOE_CUDA_CHECK(cudaMemcpy(bits.data(), a.out, bits.size() * 2, cudaMemcpyDeviceToHost));
    return bits;
  }

  MoEConfig c_;
  int world_, cap_;
  test::LayerRig single_;
  std::vector<std::unique_ptr<EPTransport>> transports_;
  std::vector<std::unique_ptr<EPLayer>> ranks_;
  DeviceBuffer<uint16_t> out_;
  std::vector<float> logits_;
};

// Runs every rank on t tokens of fresh inputs and checks the EP output
// against the reference and the single-GPU layer; rows past t stay poisoned.
void check_call(EPRig& rig, int t, const std::vector<float>& logits, uint64_t seed, const std::string& what) {
  rig.load(seed, logits);
  rig.run(t);
  const std::vector<uint16_t> ep = rig.ep_output();
  const std::vector<float> got = rig.rows(ep, t);
  EXPECT_LT(test::rel_l2(got, rig.rows(rig.reference(), t)), test::kLayerTolerance) << what;
  EXPECT_LT(test::rel_l2(got, rig.rows(rig.single_output(), t)), test::kLayerTolerance) << what;
  const std::size_t h = rig.config().experts.hidden;
  for (int r = 0; r < rig.world(); ++r)
    for (std::size_t j = (std::size_t(r) * rig.cap() + t) * h; j < std::size_t(r + 1) * rig.cap() * h; ++j)
      ASSERT_EQ(ep[j], 0xffff) << what << ": rank " << r << " wrote past its " << t << " tokens";
}

TEST(EPLayerGpu, EveryWorldSizeAndTokenCount) {
  UNIMOE_REQUIRE_GPU();
  const MoEConfig c = bf16_config(RoutingPolicy::Renormalize, 16, 4);
  for (int world : {1, 2, 4, 8}) {
    EPRig rig(c, world, 64, test::fresh_seed());
    for (int t : {1, 7, 64}) {
      const uint64_t seed = test::fresh_seed();
      check_call(rig, t, ref::make_logits(c, world * 64, seed, "uniform"), seed,
                 "W " + std::to_string(world) + " T " + std::to_string(t));
    }
  }
}

TEST(EPLayerGpu, LargeCallAndHotExpert) {
  UNIMOE_REQUIRE_GPU();
  const MoEConfig c = bf16_config(RoutingPolicy::Renormalize, 16, 4);
  EPRig rig(c, 4, 1000, test::fresh_seed());
  const uint64_t seed = test::fresh_seed();
  check_call(rig, 1000, ref::make_logits(c, 4000, seed, "uniform"), seed, "uniform T 1000");
  // Every token of every rank to expert 5 (rank 1): rank 1 gets all 4000.
  check_call(rig, 1000, test::hot_expert_logits(c, 4000, seed + 1, 5), seed + 1, "hot T 1000");
}

TEST(EPLayerGpu, EveryPolicyFamily) {
  UNIMOE_REQUIRE_GPU();
  std::vector<std::pair<std::string, MoEConfig>> cases;
  cases.push_back({"sigmoid", bf16_config(RoutingPolicy::Sigmoid, 8, 2)});
  cases.push_back({"default", bf16_config(RoutingPolicy::Default, 16, 3)});
  cases.push_back({"llama4", bf16_config(RoutingPolicy::Llama4, 16, 1)});
  MoEConfig ds = bf16_config(RoutingPolicy::DeepSeekV3, 32, 4);
  ds.routing.n_group = 4;
  ds.routing.topk_group = 2;
  ds.routing.has_bias = true;
  ds.routing.routed_scaling_factor = 2.5f;
  cases.push_back({"deepseek", ds});
  MoEConfig oai = bf16_config(RoutingPolicy::Renormalize, 8, 2);
  oai.experts.activation = Activation::SwiGLUOai;
  oai.experts.has_bias = true;
  cases.push_back({"gpt-oss biases", oai});
  MoEConfig fp8 = bf16_config(RoutingPolicy::Renormalize, 16, 4);
  fp8.experts.quant = QuantVariant::FP8Block128;
  fp8.experts.hidden = 256;
  fp8.experts.intermediate = 256;
  cases.push_back({"fp8 block128", fp8});
  for (const auto& [name, c] : cases) {
    EPRig rig(c, 4, 33, test::fresh_seed());
    const uint64_t seed = test::fresh_seed();
    check_call(rig, 33, ref::make_logits(c, 4 * 33, seed, "uniform"), seed, name);
  }
}

// Dispatch's slots and counts are the reference's for the call's routing.
TEST(EPLayerGpu, DispatchSlotsMatchTheReference) {
  UNIMOE_REQUIRE_GPU();
  const MoEConfig c = bf16_config(RoutingPolicy::Renormalize, 16, 4);
  const int world = 4, cap = 50, t = 37;
  EPRig rig(c, world, cap, test::fresh_seed());
  const uint64_t seed = test::fresh_seed();
  const std::vector<float> logits = ref::make_logits(c, world * cap, seed, "zipf:1.2");
  rig.load(seed, logits);
  rig.run(t);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  for (int r = 0; r < world; ++r) {
    const ref::Routing routing =
        ref::route(c.routing, logits.data() + std::size_t(r) * cap * c.routing.num_experts, t, nullptr);
    const ref::EPSlots want = ref::ep_slots(routing.ids.data(), t, c.routing.top_k, c.routing.num_experts, world);
    std::vector<int32_t> counts(world), slots(std::size_t(t) * world);
    UNIMOE_CUDA_CHECK(cudaMemcpy(counts.data(), ep_access::dispatch_counts(rig.rank(r)), world * 4,
                                 cudaMemcpyDeviceToHost));
    UNIMOE_CUDA_CHECK(cudaMemcpy(slots.data(), ep_access::dispatch_slots(rig.rank(r)), slots.size() * 4,
                                 cudaMemcpyDeviceToHost));
    EXPECT_EQ(counts, want.counts) << "rank " << r;
    EXPECT_EQ(slots, want.slot) << "rank " << r;
  }
}

// Each token's experts on one rank, one routing (given, so that both take
// the same weights to the bit) and one GEMM tactic for both layers: the EP
// output is the single-GPU layer's, bit for bit.
TEST(EPLayerGpu, ConfinedRoutingIsBitwiseTheSingleLayer) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig c = bf16_config(RoutingPolicy::Renormalize, 16, 4);
  c.options.backend = "mma";
  DevOverrides dev;
  dev.set("mma_tactic=m64n128");
  const int world = 4, cap = 40;
  EPRig rig(c, world, cap, test::fresh_seed(), dev);
  // Token j's four best experts are 4 * (j % 4) .. + 3: rank j % 4.
  std::vector<float> logits = ref::make_logits(c, world * cap, test::fresh_seed(), "uniform");
  for (int j = 0; j < world * cap; ++j)
    for (int k = 0; k < 4; ++k) logits[std::size_t(j) * 16 + (j % 4) * 4 + k] += 50.0f;
  const ref::Routing routing = ref::route(c.routing, logits.data(), world * cap, nullptr);
  DeviceBuffer<int32_t> ids(routing.ids);
  DeviceBuffer<float> weights(routing.weights);
  rig.load(test::fresh_seed(), logits);
  rig.run(cap, nullptr, ids.get(), weights.get());
  const std::vector<uint16_t> ep = rig.ep_output();
  const std::vector<uint16_t> single = rig.single_output(ids.get(), weights.get());
  for (std::size_t j = 0; j < ep.size(); ++j) ASSERT_EQ(ep[j], single[j]) << "element " << j;
}

TEST(EPLayerGpu, EmptyCallsWriteNothing) {
  UNIMOE_REQUIRE_GPU();
  const MoEConfig c = bf16_config(RoutingPolicy::Renormalize, 16, 4);
  EPRig rig(c, 2, 16, test::fresh_seed());
  const uint64_t seed = test::fresh_seed();
  // Rank 0 has no tokens while rank 1 has 16; then both have none.
  rig.load(seed, ref::make_logits(c, 32, seed, "uniform"));
  for (EPLayer::Step s : kEPSteps) {
    rig.rank(0).run_step(s, rig.rank_args(0, 0), nullptr);
    rig.rank(1).run_step(s, rig.rank_args(1, 16), nullptr);
  }
  std::vector<uint16_t> ep = rig.ep_output();
  const std::vector<float> want = rig.reference();
  for (std::size_t j = 0; j < 16 * 128; ++j) ASSERT_EQ(ep[j], 0xffff) << "rank 0 wrote element " << j;
  std::vector<float> got1, want1;
  for (std::size_t j = 16 * 128; j < 32 * 128; ++j) {
    got1.push_back(ref::bf16_to_f32(ep[j]));
    want1.push_back(want[j]);
  }
  EXPECT_LT(test::rel_l2(got1, want1), test::kLayerTolerance);
  rig.load(seed, ref::make_logits(c, 32, seed, "uniform"));
  rig.run(0);
  ep = rig.ep_output();
  for (uint16_t b : ep) ASSERT_EQ(b, 0xffff);
}

// One graph holds every rank's steps; replays with new routing (uniform,
// then one hot expert, then precomputed ids given in place of logits is a
// different call: not replayed) match the reference each time.
TEST(EPLayerGpu, CapturedOnceReplaysWithFreshRouting) {
  UNIMOE_REQUIRE_GPU();
  const MoEConfig c = bf16_config(RoutingPolicy::Renormalize, 16, 4);
  const int world = 4, cap = 24;
  EPRig rig(c, world, cap, test::fresh_seed());
  rig.load(test::fresh_seed(), ref::make_logits(c, world * cap, 1, "uniform"));
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  graph = test::capture(stream, cudaStreamCaptureModeThreadLocal, [&] {
    rig.run(cap, stream);
  });
  UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    const uint64_t seed = test::fresh_seed();
    const std::vector<float> logits = replay == 1 ? test::hot_expert_logits(c, world * cap, seed, 13)
                                                  : ref::make_logits(c, world * cap, seed, "uniform");
    rig.load(seed, logits);
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<float> got = rig.rows(rig.ep_output(), cap);
    EXPECT_LT(test::rel_l2(got, rig.rows(rig.reference(), cap)), test::kLayerTolerance) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The EP layers of one model share one scratch a rank: two layers of
// different shapes, each rank's pair on that rank's buffer, run one after
// another eagerly (A, B, then A again with another token count) and in one
// graph replayed with fresh routing, give the bits of twin groups with
// buffers of their own; create refuses a scratch that is null or too small.
TEST(EPLayerGpu, LayersOfAModelShareOneScratchARank) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig ca = bf16_config(RoutingPolicy::Renormalize, 16, 4);
  MoEConfig cb = bf16_config(RoutingPolicy::Default, 32, 2);
  cb.experts.hidden = 256;
  const int world = 2, cap = 24;
  const std::size_t bytes = std::max(EPLayer::scratch_bytes(ca, cap, world),
                                     EPLayer::scratch_bytes(cb, cap, world));
  std::vector<DeviceBuffer<uint8_t>> buffers;
  std::vector<void*> scratch;
  for (int r = 0; r < world; ++r) {
    buffers.emplace_back(bytes);
    scratch.push_back(buffers.back().get());
  }
  EPRig a(ca, world, cap, seed, {}, scratch, bytes), b(cb, world, cap, seed + 1, {}, scratch, bytes);
  EPRig a_own(ca, world, cap, seed), b_own(cb, world, cap, seed + 1);
  auto same = [&](EPRig& shared, EPRig& own, int t, uint64_t s, const std::string& what) {
    const std::vector<uint16_t> got = shared.ep_output();
    own.load(s, ref::make_logits(own.config(), world * cap, s, "uniform"));
    own.run(t);
    EXPECT_EQ(got, own.ep_output()) << what;
    EXPECT_LT(test::rel_l2(shared.rows(got, t), shared.rows(shared.reference(), t)),
              test::kLayerTolerance) << what;
  };
  auto load = [&](EPRig& rig, uint64_t s) {
    rig.load(s, ref::make_logits(rig.config(), world * cap, s, "uniform"));
  };
  load(a, seed + 10);
  load(b, seed + 11);
  a.run(cap);
  b.run(17);
  same(a, a_own, cap, seed + 10, "A, before B ran");
  same(b, b_own, 17, seed + 11, "B, after A");
  load(a, seed + 12);
  a.run(5);
  same(a, a_own, 5, seed + 12, "A again, after B");

  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = test::capture(stream, cudaStreamCaptureModeThreadLocal, [&] {
    a.run(cap, stream);
    b.run(cap, stream);
  });
  cudaGraphExec_t exec;
  UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    const uint64_t s = seed + 20 + 2 * replay;
    load(a, s);
    load(b, s + 1);
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    same(a, a_own, cap, s, "A replayed " + std::to_string(replay));
    same(b, b_own, cap, s + 1, "B replayed " + std::to_string(replay));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);

  auto transports = make_loopback_transports(world);
  EXPECT_EQ(test::error_of([&] { EPLayer::create(ca, cap, *transports[0], nullptr, bytes); }).field(),
            "scratch");
  EXPECT_EQ(test::error_of([&] {
              EPLayer::create(ca, cap, *transports[0], scratch[0],
                              EPLayer::scratch_bytes(ca, cap, world) - 256);
            }).field(),
            "scratch");
  EXPECT_EQ(test::error_of([&] { EPLayer::scratch_bytes(ca, cap, 0); }).field(), "world_size");
}

TEST(EPLayerGpu, RefusesBadGroupsAndCalls) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig c = bf16_config(RoutingPolicy::Renormalize, 12, 2);
  auto eight = make_loopback_transports(8);
  EXPECT_EQ(test::error_of([&] { EPLayer::create(c, 8, *eight[0]); }).field(), "routing.num_experts");
  c.routing.num_experts = 16;
  MoEConfig ranged = c;
  ranged.experts.num_local_experts = 2;
  EXPECT_EQ(test::error_of([&] { EPLayer::create(ranged, 8, *eight[0]); }).field(),
            "experts.num_local_experts");
  EXPECT_EQ(test::error_of([] { make_loopback_transports(0); }).field(), "ep.world_size");
  auto two = make_loopback_transports(2);
  auto layer = EPLayer::create(c, 8, *two[0]);
  ForwardArgs a;
  a.num_tokens = 9;
  EXPECT_EQ(test::error_of([&] { layer->forward(a, nullptr); }).field(), "num_tokens");
  // FP8PerTensor without static activation scales.
  MoEConfig per_tensor = c;
  per_tensor.experts.quant = QuantVariant::FP8PerTensor;
  per_tensor.experts.hidden = 128;  // the GPU's FP8 GEMMs: multiples of 128
  per_tensor.experts.intermediate = 128;
  auto fp8 = EPLayer::create(per_tensor, 8, *two[0]);
  EXPECT_EQ(test::error_of([&] { fp8->set_weights(ExpertWeights{}); }).field(), "weights.x_scale");
  // A rank that starts a second exchange before its peer made the first.
  EPRig rig(c, 2, 8, test::fresh_seed());
  rig.load(1, ref::make_logits(c, 16, 1, "uniform"));
  rig.rank(0).run_step(EPLayer::Step::Dispatch, rig.rank_args(0, 8), nullptr);
  rig.rank(0).run_step(EPLayer::Step::Exchange, rig.rank_args(0, 8), nullptr);
  EXPECT_THROW(rig.rank(0).run_step(EPLayer::Step::Exchange, rig.rank_args(0, 8), nullptr),
               std::runtime_error);
}

// A group of one over NCCL on this GPU (NCCL from the process or the
// loader path): the layer over NCCL matches the single-GPU layer.
TEST(EPLayerGpu, NcclGroupOfOne) {
  UNIMOE_REQUIRE_GPU();
  const std::string why = nccl_support();
  if (!why.empty()) GTEST_SKIP() << "NCCL not usable here: " << why;
  const MoEConfig c = bf16_config(RoutingPolicy::Renormalize, 16, 4);
  test::LayerRig single(c, 64, test::fresh_seed());
  ncclComm* comm = nccl::init_rank(nccl::unique_id(), 1, 0);
  {
    auto transport = make_nccl_transport(comm);
    EXPECT_EQ(transport->world_size(), 1);
    auto layer = EPLayer::create(c, 64, *transport);
    layer->set_weights(single.device_weights());
    const uint64_t seed = test::fresh_seed();
    const std::vector<float> logits = ref::make_logits(c, 64, seed, "uniform");
    single.load_inputs(64, seed, logits);
    DeviceBuffer<uint16_t> out(64 * 128);
    out.poison();
    ForwardArgs a = single.args(64);
    a.out = out.get();
    layer->forward(a, nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got;
    for (uint16_t b : out.download()) got.push_back(ref::bf16_to_f32(b));
    EXPECT_LT(test::rel_l2(got, single.reference(64, logits)), test::kLayerTolerance);
  }
  nccl::destroy(comm);
}

}  // namespace
}  // namespace unimoe
