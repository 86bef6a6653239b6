// Stress and concurrency tests of the layer and of its thread-safety
// contract (include/unimoe/unimoe.h, class MoELayer; docs/design.md,
// "Threads and streams"):
// - 10,000 cycles of create -> set_weights -> forward -> destroy over random
//   valid configs leave device memory where it was, and every 100th cycle's
//   first two tokens match the CPU reference;
// - two layers forwarding at once on two streams, and two threads each with
//   its own layer and stream, write the bits of a serial run;
// - four threads create, run and destroy layers at once without an error.
// Inputs come from one pool filled once (gpu/stress_pool.h). Metrics: the
// relative L2 error of the layer tests (test::kLayerTolerance); bitwise
// equality between concurrent and serial runs (the forward is deterministic).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/routing_cases.h"
#include "gpu/gpu_test_util.h"
#include "gpu/layer_rig.h"
#include "gpu/stress_pool.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;
using test::kStressMaxTokens;
using test::StressPool;

constexpr int kCycles = 10000;
constexpr int kCheckEvery = 100;
constexpr int kCheckTokens = 2;
// A cudaMalloc reserves device memory in 2 MiB pages and the driver keeps
// freed pages for reuse, so free memory moves by up to a page without a
// leak. A leak shows far above it: the smallest workspace is a few KiB, and
// 10,000 of them are tens of MiB.
constexpr std::size_t kLeakSlackBytes = std::size_t{2} << 20;
constexpr uint16_t kPoisonBits = 0xffff;  // a byte-wise 0xff poison: a bf16 NaN

// ------------------------------------------------------- random configs ----

constexpr Activation kActivations[] = {Activation::SwiGLU, Activation::GeGLU, Activation::ReLU2,
                                       Activation::SwiGLUOai};
constexpr const char* kBackends[] = {"auto", "mma", "cutlass", "stream"};
constexpr const char* kRoutingVariants[] = {"auto", "split", "fused", "cluster"};
// Expert counts where the kernels change shape (a lane's slots, a warp, a
// power of two and one either side); half the configs take one of these.
constexpr int kEdgeExperts[] = {1,  2,  3,  4,  7,   8,   9,   16,  31,  32,  33,
                                63, 64, 65, 96, 127, 128, 129, 160, 192, 255, 256};

int uniform(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}
bool chance(std::mt19937_64& rng, int percent) { return uniform(rng, 1, 100) <= percent; }
template <class T, std::size_t N>
T one_of(std::mt19937_64& rng, const T (&values)[N]) {
  return values[uniform(rng, 0, static_cast<int>(N) - 1)];
}

// A config inside the stress bounds, valid by construction: every choice
// is drawn from what validate() allows given the choices before it.
MoEConfig random_config(std::mt19937_64& rng) {
  MoEConfig c;
  RoutingConfig& r = c.routing;
  r.policy = one_of(rng, test::kAllPolicies);
  r.num_experts = chance(rng, 50) ? one_of(rng, kEdgeExperts) : uniform(rng, 1, test::kStressMaxExperts);
  const int e = r.num_experts;
  int max_k = std::min(e, test::kStressMaxTopK);
  if (r.policy == RoutingPolicy::DeepSeekV3) {
    // n_group divides E, leaves at least 2 experts a group, is at most 16.
    std::vector<int> groups{1};
    for (int g = 2; g <= 16 && 2 * g <= e; ++g)
      if (e % g == 0) groups.push_back(g);
    r.n_group = groups[uniform(rng, 0, static_cast<int>(groups.size()) - 1)];
    r.topk_group = uniform(rng, 1, std::min(r.n_group, 8));
    if (r.n_group > 1) max_k = std::min(max_k, r.topk_group * (e / r.n_group));
  }
  r.top_k = r.policy == RoutingPolicy::Llama4 ? 1 : uniform(rng, 1, max_k);
  if (r.policy == RoutingPolicy::DeepSeekV3 || r.policy == RoutingPolicy::MiniMax2) {
    r.has_bias = chance(rng, 50);
    r.routed_scaling_factor = chance(rng, 50) ? 1.0f : 2.5f;
  }
  r.logits_type = chance(rng, 50) ? LogitsType::F32 : LogitsType::BF16;
  ExpertsConfig& x = c.experts;
  const int hm = hidden_multiple(x.quant), im = intermediate_multiple(x.quant);
  x.hidden = hm * uniform(rng, 1, test::kStressMaxHidden / hm);
  x.intermediate = im * uniform(rng, 1, test::kStressMaxInter / im);
  x.activation = one_of(rng, kActivations);
  x.has_bias = chance(rng, x.activation == Activation::SwiGLUOai ? 75 : 25);
  if (chance(rng, 30)) {  // an expert-parallel range
    x.local_expert_offset = uniform(rng, 0, e - 1);
    x.num_local_experts = uniform(rng, 1, e - x.local_expert_offset);
  }
  c.options.backend = one_of(rng, kBackends);
  c.options.routing_variant = one_of(rng, kRoutingVariants);
  return c;
}

struct Cycle {
  MoEConfig config;
  int max_tokens = 1;
  int tokens = 0;
  std::string describe() const {
    return config.to_string() + " max_tokens=" + std::to_string(max_tokens) +
           " T=" + std::to_string(tokens);
  }
};

// n cycles from `seed`. A config validate() refuses is a fault of the
// generator: the test fails with its text.
std::vector<Cycle> random_cycles(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Cycle> cycles(n);
  for (Cycle& cy : cycles) {
    cy.config = random_config(rng);
    cy.max_tokens = chance(rng, 30) ? uniform(rng, 1, 16) : uniform(rng, 1, kStressMaxTokens);
    cy.tokens = uniform(rng, 0, cy.max_tokens);
    try {
      validate(cy.config);
    } catch (const Error& e) {
      ADD_FAILURE() << "the generator made an invalid config: " << cy.config.to_string() << ": "
                    << e.what();
    }
  }
  return cycles;
}

// ---------------------------------------------------- buffers, cycles ----

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

std::vector<uint16_t> download_rows(const uint16_t* out, int rows, int hidden) {
  std::vector<uint16_t> bits(static_cast<std::size_t>(rows) * hidden);
  if (!bits.empty())
    UNIMOE_CUDA_CHECK(cudaMemcpy(bits.data(), out, bits.size() * 2, cudaMemcpyDeviceToHost));
  return bits;
}

void poison_rows(uint16_t* out, int rows, int hidden, cudaStream_t s) {
  UNIMOE_CUDA_CHECK(cudaMemsetAsync(out, 0xff, static_cast<std::size_t>(rows) * hidden * 2, s));
}

bool has_poison(const std::vector<uint16_t>& bits) {
  return std::find(bits.begin(), bits.end(), kPoisonBits) != bits.end();
}

// One cycle on `stream`, its output into `out`; the first `check_rows`
// output rows are poisoned before the forward and returned after it.
std::vector<uint16_t> run_cycle(const Cycle& cy, const StressPool& pool, uint16_t* out,
                                int check_rows, cudaStream_t stream) {
  std::unique_ptr<MoELayer> layer = MoELayer::create(cy.config, cy.max_tokens);
  layer->set_weights(pool.weights(cy.config));
  poison_rows(out, check_rows, cy.config.experts.hidden, stream);
  layer->forward(pool.args(cy.config, cy.tokens, out), stream);
  // A layer is destroyed only once its forwards are complete (the contract).
  UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return download_rows(out, check_rows, cy.config.experts.hidden);
}

std::size_t free_device_memory() {
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  std::size_t free = 0, total = 0;
  UNIMOE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

TEST(StressGpu, CreateForwardDestroyDoesNotLeak) {
  UNIMOE_REQUIRE_GPU();
  const std::vector<Cycle> cycles = random_cycles(kCycles, 0x5eed);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const StressPool pool;
  DeviceBuffer<uint16_t> out(std::size_t{kStressMaxTokens} * test::kStressMaxHidden);
  Stream stream;
  // Warm-up: the same sequence once. The driver loads a kernel's code into
  // device memory the first time it runs (lazy loading), and a kernel that
  // first ran late in the measured pass would read as a leak; after this
  // pass, every kernel the sequence launches is loaded.
  const auto warm_start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < cycles.size(); ++i) {
    try {
      run_cycle(cycles[i], pool, out.get(), 0, stream.s);
    } catch (const std::exception& e) {
      FAIL() << "warm-up cycle " << i << " (" << cycles[i].describe() << "): " << e.what();
    }
  }
  const double warm_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - warm_start).count();
  const std::size_t free_before = free_device_memory();
  int checked = 0;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < cycles.size(); ++i) {
    const Cycle& cy = cycles[i];
    const int n = i % kCheckEvery == 0 ? std::min(cy.tokens, kCheckTokens) : 0;
    std::vector<uint16_t> bits;
    try {
      bits = run_cycle(cy, pool, out.get(), n, stream.s);
    } catch (const std::exception& e) {
      FAIL() << "cycle " << i << " (" << cy.describe() << "): " << e.what();
    }
    if (n == 0) continue;
    ++checked;
    const double err = test::rows_error(bits, n, cy.config.experts.hidden, pool.reference(cy.config, n));
    ASSERT_LT(err, test::kLayerTolerance) << "cycle " << i << " (" << cy.describe() << ")";
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::size_t free_after = free_device_memory();
  const double lost_mib = (static_cast<double>(free_before) - static_cast<double>(free_after)) / (1 << 20);
  std::printf("StressGpu: warm-up %.2f s; %d cycles in %.2f s (%.0f us a cycle, %d checked against "
              "the reference); free device memory %.1f MiB lower after them\n",
              warm_seconds, kCycles, seconds, seconds * 1e6 / kCycles, checked, lost_mib);
  EXPECT_LE(free_before, free_after + kLeakSlackBytes)
      << "free device memory fell by " << lost_mib << " MiB over " << kCycles << " cycles";
}

// ------------------------------------------------------ two at a time ----

// Two configs unlike each other: policy, logits type, sizes, activation,
// expert biases, backend and routing variant.
MoEConfig first_config() {
  MoEConfig c;
  c.routing = {RoutingPolicy::Renormalize, 64, 6};
  c.experts.hidden = 256;
  c.experts.intermediate = 128;
  return c;
}
MoEConfig second_config() {
  MoEConfig c;
  c.routing = {RoutingPolicy::DeepSeekV3, 128, 8, 8, 4, 2.5f, true, LogitsType::BF16};
  c.experts.hidden = 512;
  c.experts.intermediate = 192;
  c.experts.activation = Activation::SwiGLUOai;
  c.experts.has_bias = true;
  c.options.backend = "mma";
  c.options.routing_variant = "cluster";
  return c;
}

// The token counts of one layer's calls, one output buffer each.
constexpr int kCallTokens[] = {1, 5, 16, 37, 64, 130, 200, 256};
constexpr int kCalls = static_cast<int>(std::size(kCallTokens));
using CallBits = std::vector<std::vector<uint16_t>>;  // [call][T * H]

class CallOutputs {
 public:
  explicit CallOutputs(int hidden) : hidden_(hidden) {
    for (int i = 0; i < kCalls; ++i) bufs_.emplace_back(std::size_t{kStressMaxTokens} * hidden);
  }
  uint16_t* at(int call) { return bufs_[call].get(); }
  void poison(cudaStream_t s) {
    for (int i = 0; i < kCalls; ++i) poison_rows(at(i), kStressMaxTokens, hidden_, s);
  }
  CallBits download() {
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    CallBits bits;
    for (int i = 0; i < kCalls; ++i) bits.push_back(download_rows(at(i), kCallTokens[i], hidden_));
    return bits;
  }

 private:
  int hidden_;
  std::vector<DeviceBuffer<uint16_t>> bufs_;
};

// Every call of a serial run wrote all its rows, and its first rows match
// the reference (so that agreeing with it means agreeing with the reference).
void expect_serial_run_correct(const MoEConfig& c, const StressPool& pool, const CallBits& bits) {
  const std::vector<float> want = pool.reference(c, 1);
  for (int i = 0; i < kCalls; ++i) {
    SCOPED_TRACE(c.to_string() + " T=" + std::to_string(kCallTokens[i]));
    EXPECT_FALSE(has_poison(bits[i])) << "rows left unwritten";
    EXPECT_LT(test::rows_error(bits[i], 1, c.experts.hidden, want), test::kLayerTolerance);
  }
}

TEST(StressGpu, TwoLayersOnTwoStreamsMatchOneAtATime) {
  UNIMOE_REQUIRE_GPU();
  const StressPool pool;
  const MoEConfig configs[2] = {first_config(), second_config()};
  std::unique_ptr<MoELayer> layers[2];
  std::unique_ptr<CallOutputs> outs[2];
  for (int l = 0; l < 2; ++l) {
    layers[l] = MoELayer::create(configs[l], kStressMaxTokens);
    layers[l]->set_weights(pool.weights(configs[l]));
    outs[l] = std::make_unique<CallOutputs>(configs[l].experts.hidden);
  }
  // One at a time on one stream.
  Stream one;
  CallBits serial[2];
  for (int l = 0; l < 2; ++l) {
    outs[l]->poison(one.s);
    for (int i = 0; i < kCalls; ++i) {
      layers[l]->forward(pool.args(configs[l], kCallTokens[i], outs[l]->at(i)), one.s);
      UNIMOE_CUDA_CHECK(cudaStreamSynchronize(one.s));
    }
    serial[l] = outs[l]->download();
    expect_serial_run_correct(configs[l], pool, serial[l]);
  }
  // Both at once, each on its own stream, every call queued before any
  // completes; three rounds, so that the two streams overlap.
  Stream streams[2];
  for (int l = 0; l < 2; ++l) outs[l]->poison(streams[l].s);
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < kCalls; ++i)
      for (int l = 0; l < 2; ++l)
        layers[l]->forward(pool.args(configs[l], kCallTokens[i], outs[l]->at(i)), streams[l].s);
  for (int l = 0; l < 2; ++l) {
    const CallBits concurrent = outs[l]->download();
    for (int i = 0; i < kCalls; ++i)
      EXPECT_TRUE(concurrent[i] == serial[l][i])
          << configs[l].to_string() << " T=" << kCallTokens[i] << ": differs from the serial run";
  }
}

// ------------------------------------------------------------ threads ----

// From the calling thread: a fresh layer of `c` and a fresh stream on
// `device`, `rounds` rounds of the calls, the last round's outputs.
CallBits run_own_layer(const MoEConfig& c, const StressPool& pool, int device, int rounds) {
  UNIMOE_CUDA_CHECK(cudaSetDevice(device));
  std::unique_ptr<MoELayer> layer = MoELayer::create(c, kStressMaxTokens);
  layer->set_weights(pool.weights(c));
  Stream stream;
  CallOutputs outs(c.experts.hidden);
  outs.poison(stream.s);
  for (int round = 0; round < rounds; ++round)
    for (int i = 0; i < kCalls; ++i) layer->forward(pool.args(c, kCallTokens[i], outs.at(i)), stream.s);
  UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream.s));
  return outs.download();
}

TEST(StressGpu, TwoThreadsEachWithItsOwnLayer) {
  UNIMOE_REQUIRE_GPU();
  int device = 0;
  UNIMOE_CUDA_CHECK(cudaGetDevice(&device));
  const StressPool pool;
  const MoEConfig configs[2] = {first_config(), second_config()};
  constexpr int kRounds = 4;
  CallBits serial[2], threaded[2];
  for (int l = 0; l < 2; ++l) {
    serial[l] = run_own_layer(configs[l], pool, device, 1);
    expect_serial_run_correct(configs[l], pool, serial[l]);
  }
  std::string errors[2];
  std::vector<std::thread> threads;
  for (int l = 0; l < 2; ++l)
    threads.emplace_back([&, l] {
      try {
        threaded[l] = run_own_layer(configs[l], pool, device, kRounds);
      } catch (const std::exception& e) {
        errors[l] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  for (int l = 0; l < 2; ++l) {
    ASSERT_EQ(errors[l], "") << configs[l].to_string();
    for (int i = 0; i < kCalls; ++i)
      EXPECT_TRUE(threaded[l][i] == serial[l][i])
          << configs[l].to_string() << " T=" << kCallTokens[i] << ": differs from the serial run";
  }
}

TEST(StressGpu, FourThreadsCreateRunAndDestroyLayersAtOnce) {
  UNIMOE_REQUIRE_GPU();
  int device = 0;
  UNIMOE_CUDA_CHECK(cudaGetDevice(&device));
  const StressPool pool;
  constexpr int kThreads = 4, kPerThread = 300;
  std::vector<Cycle> cycles[kThreads];
  for (int t = 0; t < kThreads; ++t) cycles[t] = random_cycles(kPerThread, 0x5eed + 1 + t);
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::string errors[kThreads];
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        UNIMOE_CUDA_CHECK(cudaSetDevice(device));
        Stream stream;
        DeviceBuffer<uint16_t> out(std::size_t{kStressMaxTokens} * test::kStressMaxHidden);
        for (int i = 0; i < kPerThread && errors[t].empty(); ++i) {
          const Cycle& cy = cycles[t][i];
          const std::string where = "cycle " + std::to_string(i) + " (" + cy.describe() + "): ";
          try {
            if (has_poison(run_cycle(cy, pool, out.get(), std::min(cy.tokens, kCheckTokens), stream.s)))
              errors[t] = where + "rows left unwritten";
          } catch (const std::exception& e) {
            errors[t] = where + e.what();
          }
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
}

}  // namespace
}  // namespace unimoe
