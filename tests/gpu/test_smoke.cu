// The first device check: the fill kernel draws counter-based random numbers
// and rounds them to bf16; the host computes the same with the CPU reference
// and the results must agree bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/test_util.h"
#include "core/hash_random.h"
#include "gpu/gpu_test_util.h"
#include "kernels/common/fill.cuh"
#include "ref/ref.h"

namespace unimoe {
namespace {

TEST(GpuSmoke, DeviceRandomBf16MatchesTheHostBitForBit) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int n = 1000003;  // odd size: the grid-stride tail is exercised
  test::DeviceBuffer<uint16_t> out(n);
  out.poison();
  launch_fill_bf16(out.get(), n, seed, 3.0f, nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = out.download();
  int mismatches = 0;
  for (int i = 0; i < n; ++i) {
    const uint16_t want = ref::f32_to_bf16(hash_uniform(seed, i) * 3.0f);
    if (got[i] != want && ++mismatches <= 5)
      ADD_FAILURE() << "element " << i << ": device " << got[i] << " host " << want;
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace unimoe
