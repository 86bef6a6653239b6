// The weight-streaming patterns (kernels/stream_patterns.cuh) read every
// 32-bit word of the matrix exactly once: the XOR of the per-CTA sinks must
// equal the XOR of the whole matrix (a word read twice cancels, one skipped
// is missing), on random data with several shapes.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "support/stream_patterns.cuh"

namespace unimoe {
namespace {

TEST(StreamPatternsGpu, EveryPatternReadsEveryWordOnce) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Shape {
    long long rows;
    int k, k_chunk;
  };
  // Odd CTA counts (warps not a multiple of 8), one chunk and several.
  for (Shape s : {Shape{16, 256, 256}, Shape{48, 1024, 256}, Shape{144, 2048, 1024}}) {
    std::vector<uint16_t> host(static_cast<std::size_t>(s.rows) * s.k);
    for (uint16_t& v : host) v = static_cast<uint16_t>(rng());
    uint32_t want = 0;
    for (std::size_t i = 0; i < host.size(); i += 2) want ^= host[i] | (uint32_t(host[i + 1]) << 16);
    test::DeviceBuffer<uint16_t> w(host);
    StreamPatternArgs args;
    args.w = w.get();
    args.rows = s.rows;
    args.k = s.k;
    args.k_chunk = s.k_chunk;
    const long long ctas = stream_pattern_ctas(args);
    test::DeviceBuffer<uint32_t> sink(static_cast<std::size_t>(ctas));
    args.sink = sink.get();
    for (StreamPattern p : kStreamPatterns) {
      SCOPED_TRACE(std::string(stream_pattern_name(p)) + " rows " + std::to_string(s.rows) +
                   " k " + std::to_string(s.k));
      sink.upload(std::vector<uint32_t>(static_cast<std::size_t>(ctas), 0));
      launch_stream_pattern(p, args, nullptr);
      UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
      uint32_t got = 0;
      for (uint32_t v : sink.download()) got ^= v;
      EXPECT_EQ(got, want);
    }
  }
}

TEST(StreamPatternsGpu, RefusesShapesItDoesNotTake) {
  UNIMOE_REQUIRE_GPU();
  test::DeviceBuffer<uint16_t> w(16 * 512);
  test::DeviceBuffer<uint32_t> sink(8);
  StreamPatternArgs ok;
  ok.w = w.get();
  ok.rows = 16;
  ok.k = 512;
  ok.k_chunk = 256;
  ok.sink = sink.get();
  auto refused = [&](StreamPatternArgs a) {
    EXPECT_THROW(launch_stream_pattern(StreamPattern::Rows16x64B, a, nullptr), std::invalid_argument);
  };
  StreamPatternArgs a = ok;
  a.rows = 20;  // not a multiple of 16
  refused(a);
  a = ok;
  a.k_chunk = 128;  // not a multiple of 256
  refused(a);
  a = ok;
  a.k = 640;  // not a multiple of k_chunk
  refused(a);
  a = ok;
  a.sink = nullptr;
  refused(a);
}

}  // namespace
}  // namespace unimoe
