// The launch floor probe (kernels/launch_floor.cuh): every form runs in
// every shape `unimoe-bench --launch-floor` times, directly and replayed
// from a graph (a handoff whose arrivals fell short of its mbarrier's count
// would hang here), and the probe refuses shapes that are not a launch.
// Also the instruction-cache evicting kernels (launch_icache_evict): they
// run on every SM's share of CTAs, write their whole sink, and refuse bad
// arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "support/launch_floor.cuh"
#include "layer/graph_timing.h"

namespace unimoe {
namespace {

struct ProbeShape {
  int ctas, cluster_ctas, threads;
};

constexpr FloorSteps kAllSteps[] = {FloorSteps::kEmpty, FloorSteps::kLoad, FloorSteps::kLoadBarrier,
                                    FloorSteps::kLoadHandoff, FloorSteps::kLoadCtaHandoff};

// word[0]; word[1] (a non-zero loaded value) must stay poisoned.
int32_t read_word(const test::DeviceBuffer<int32_t>& word) {
  const std::vector<int32_t> got = word.download();
  EXPECT_EQ(got[1], -1);
  return got[0];
}

TEST(LaunchFloorGpu, EveryFormAndShapeWritesItsThreadCount) {
  UNIMOE_REQUIRE_GPU();
  const ProbeShape shapes[] = {{1, 0, 256},  {1, 0, 1024}, {2, 2, 256}, {8, 8, 1024},
                               {16, 16, 256}, {48, 16, 32}, {3, 0, 96},   {2, 1, 64}};
  test::DeviceBuffer<float> src(std::vector<float>(48 * 1024, 0.0f));
  test::DeviceBuffer<int32_t> word(2);
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int cases = 0;
  for (const FloorSteps steps : kAllSteps) {
    for (const ProbeShape s : shapes) {
      SCOPED_TRACE(std::string(floor_steps_name(steps)) + ": " + std::to_string(s.ctas) +
                   " CTAs, clusters of " + std::to_string(s.cluster_ctas) + ", " +
                   std::to_string(s.threads) + " threads");
      const int32_t want = s.ctas * s.threads;
      word.poison();
      launch_floor_probe(steps, s.ctas, s.cluster_ctas, s.threads, src.get(), word.get(), nullptr);
      UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(read_word(word), want);

      // Replayed from a graph, twice, the word poisoned before each replay.
      cudaGraphExec_t g = capture(stream, [&] {
        for (int c = 0; c < 3; ++c)
          launch_floor_probe(steps, s.ctas, s.cluster_ctas, s.threads, src.get(), word.get(), stream);
      });
      for (int replay = 0; replay < 2; ++replay) {
        UNIMOE_CUDA_CHECK(cudaMemsetAsync(word.get(), 0xff, 2 * sizeof(int32_t), stream));
        UNIMOE_CUDA_CHECK(cudaGraphLaunch(g, stream));
        UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
        EXPECT_EQ(read_word(word), want);
      }
      UNIMOE_CUDA_CHECK(cudaGraphExecDestroy(g));
      ++cases;
    }
  }
  UNIMOE_CUDA_CHECK(cudaStreamDestroy(stream));
  EXPECT_EQ(cases, 40);
}

// The loads are real: a non-zero value read by any thread reaches word[1].
TEST(LaunchFloorGpu, TheLoadFormsReadTheirSource) {
  UNIMOE_REQUIRE_GPU();
  std::vector<float> host(16 * 256, 0.0f);
  host[16 * 256 - 1] = 7.0f;  // the last thread of the last CTA
  test::DeviceBuffer<float> src(host);
  test::DeviceBuffer<int32_t> word(2);
  for (const FloorSteps steps :
       {FloorSteps::kLoad, FloorSteps::kLoadBarrier, FloorSteps::kLoadHandoff,
        FloorSteps::kLoadCtaHandoff}) {
    SCOPED_TRACE(floor_steps_name(steps));
    word.poison();
    launch_floor_probe(steps, 16, 16, 256, src.get(), word.get(), nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> got = word.download();
    EXPECT_EQ(got[0], 16 * 256);
    EXPECT_EQ(got[1], 7);
  }
}

// The shape checks come before any CUDA call, so they run without a GPU.
TEST(LaunchFloorGpu, RefusesShapesThatAreNotALaunch) {
  // Never dereferenced: every call below throws before it launches.
  int32_t* const word = reinterpret_cast<int32_t*>(16);
  const float* const src = reinterpret_cast<const float*>(16);
  const FloorSteps empty = FloorSteps::kEmpty;
  EXPECT_THROW(launch_floor_probe(empty, 0, 0, 256, src, word, nullptr), std::invalid_argument);
  EXPECT_THROW(launch_floor_probe(empty, 1, 0, 100, src, word, nullptr), std::invalid_argument);
  EXPECT_THROW(launch_floor_probe(empty, 1, 0, 2048, src, word, nullptr), std::invalid_argument);
  EXPECT_THROW(launch_floor_probe(empty, 12, 8, 256, src, word, nullptr), std::invalid_argument);
  EXPECT_THROW(launch_floor_probe(empty, 32, 32, 256, src, word, nullptr), std::invalid_argument);
  EXPECT_THROW(launch_floor_probe(empty, 1, -1, 256, src, word, nullptr), std::invalid_argument);
  EXPECT_THROW(launch_floor_probe(empty, 1, 0, 256, src, nullptr, nullptr), std::invalid_argument);
  EXPECT_THROW(launch_floor_probe(FloorSteps::kLoad, 1, 0, 256, nullptr, word, nullptr),
               std::invalid_argument);
  EXPECT_THROW(launch_floor_probe(FloorSteps::kLoadBarrier, 1, 0, 256, nullptr, word, nullptr),
               std::invalid_argument);
  EXPECT_THROW(launch_floor_probe(static_cast<FloorSteps>(7), 1, 0, 256, src, word, nullptr),
               std::invalid_argument);
}

TEST(LaunchFloorGpu, IcacheEvictWritesItsWholeSink) {
  UNIMOE_REQUIRE_GPU();
  int num_sms = 0;
  UNIMOE_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  const std::size_t n = std::size_t(icache_evict_sink_floats(num_sms));
  ASSERT_EQ(n, std::size_t(2) * num_sms * 1024);
  test::DeviceBuffer<float> sink(n);
  UNIMOE_CUDA_CHECK(cudaMemset(sink.get(), 0xff, n * sizeof(float)));  // NaN
  launch_icache_evict(num_sms, sink.get(), nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = sink.download();
  for (std::size_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(got[i])) << "sink[" << i << "]";
}

TEST(LaunchFloorGpu, IcacheEvictRefusesBadArguments) {
  float* const sink = reinterpret_cast<float*>(16);  // never dereferenced: both calls throw
  EXPECT_THROW(launch_icache_evict(0, sink, nullptr), std::invalid_argument);
  EXPECT_THROW(launch_icache_evict(132, nullptr, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace unimoe
