// GPU tests of the sm90 FP8 block-scaled grouped GEMM (both tactics): odd and
// empty groups, one hot group, ragged N, several K, device-only row counts,
// CUDA-graph replay with new offsets and the parameter checks, each against
// a host loop in double that dequantizes as the contract states.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "kernels/gemm/sm90_fp8_grouped_gemm.cuh"
#include "ref/ref.h"

namespace unimoe::test {
namespace {

constexpr uint16_t kPoison = 0xffff;  // DeviceBuffer::poison(): a bf16 NaN
constexpr int kBlock = 128;           // K per scale, and N per weight scale

int device_sm_count() {
  int count = 0;
  UNIMOE_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, 0));
  return count;
}

std::vector<int32_t> offsets_of(const std::vector<int>& counts) {
  std::vector<int32_t> offsets(counts.size() + 1, 0);
  for (std::size_t g = 0; g < counts.size(); ++g) offsets[g + 1] = offsets[g] + counts[g];
  return offsets;
}

// Uniform over the finite e4m3 codes: all but the NaNs 0x7f and 0xff.
std::vector<uint8_t> random_codes(std::size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> u(0, 253);
  std::vector<uint8_t> v(n);
  for (auto& c : v) {
    const int x = u(rng);
    c = static_cast<uint8_t>(x < 0x7f ? x : x + 1);
  }
  return v;
}

// Positive scales 2^e * u, e in [-4, 4], u uniform in [0.5, 2): neighbouring
// blocks differ by up to 2^10, so a scale read from the wrong place shows.
std::vector<float> random_scales(std::size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> e(-4, 4);
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  std::vector<float> v(n);
  for (auto& s : v) s = std::ldexp(u(rng), e(rng));
  return v;
}

// Device inputs of one grouped GEMM and their host copies: A [capacity, k]
// with its scales [k/128, ld], B [groups, n, k] with its scales
// [groups, ceil(n/128), k/128].
struct Fp8Inputs {
  int groups = 0, n = 0, k = 0, capacity = 0, ld = 0;
  std::vector<uint8_t> a, b;
  std::vector<float> a_scales, b_scales;
  DeviceBuffer<uint8_t> a_dev, b_dev, workspace;
  DeviceBuffer<float> a_scales_dev, b_scales_dev;
  DeviceBuffer<uint16_t> d_dev;
  DeviceBuffer<float> d_f32_dev;
  DeviceBuffer<int32_t> offsets_dev;

  Fp8Inputs(int groups_, int n_, int k_, int capacity_, std::mt19937_64& rng)
      : groups(groups_), n(n_), k(k_), capacity(capacity_),
        // A multiple of 4 past the capacity, so that ld is neither a group's
        // row count nor the total.
        ld((capacity_ + 3) / 4 * 4 + 4),
        a(random_codes(static_cast<std::size_t>(capacity_) * k_, rng)),
        b(random_codes(static_cast<std::size_t>(groups_) * n_ * k_, rng)),
        a_scales(random_scales(static_cast<std::size_t>(k_ / kBlock) * ld, rng)),
        b_scales(random_scales(static_cast<std::size_t>(groups_) * ((n_ + kBlock - 1) / kBlock) *
                                   (k_ / kBlock), rng)),
        a_dev(a), b_dev(b),
        workspace(sm90_fp8_grouped_gemm_workspace_bytes(groups_, device_sm_count())),
        a_scales_dev(a_scales), b_scales_dev(b_scales),
        d_dev(static_cast<std::size_t>(capacity_) * n_),
        d_f32_dev(static_cast<std::size_t>(capacity_) * n_), offsets_dev(groups_ + 1) {
    workspace.poison(0);  // zeroed once, as the contract asks
  }

  Sm90Fp8GroupedGemmParams params(Sm90Fp8GemmTactic tactic) const {
    Sm90Fp8GroupedGemmParams p;
    p.a = a_dev.get();
    p.a_scales = a_scales_dev.get();
    p.a_scales_ld = ld;
    p.expert_offsets = offsets_dev.get();
    p.b = b_dev.get();
    p.b_scales = b_scales_dev.get();
    p.d = d_dev.get();
    p.num_groups = groups;
    p.n = n;
    p.k = k;
    p.workspace = workspace.get();
    p.sm_count = device_sm_count();
    p.tactic = tactic;
    return p;
  }
};

// D [rows, n] in double (stored as float):
//   D[r, c] = sum_kb a_scale(r, kb) * b_scale(g, c/128, kb) * sum_{k in kb} A[r, k] * B[g][c, k].
std::vector<float> reference_gemm(const Fp8Inputs& in, const std::vector<int32_t>& offsets) {
  float lut[256];
  for (int c = 0; c < 256; ++c) lut[c] = ref::e4m3_to_f32(static_cast<uint8_t>(c));
  std::vector<float> a(in.a.size()), b(in.b.size());
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = lut[in.a[i]];
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = lut[in.b[i]];
  const int k_blocks = in.k / kBlock, n_blocks = (in.n + kBlock - 1) / kBlock;
  std::vector<float> d(static_cast<std::size_t>(offsets.back()) * in.n);
  for (int g = 0; g + 1 < static_cast<int>(offsets.size()); ++g)
    for (int r = offsets[g]; r < offsets[g + 1]; ++r)
      for (int c = 0; c < in.n; ++c) {
        const float* a_row = &a[static_cast<std::size_t>(r) * in.k];
        const float* b_row = &b[(static_cast<std::size_t>(g) * in.n + c) * in.k];
        const float* b_scale =
            &in.b_scales[(static_cast<std::size_t>(g) * n_blocks + c / kBlock) * k_blocks];
        double sum = 0;
        for (int kb = 0; kb < k_blocks; ++kb) {
          double block = 0;
          for (int i = kb * kBlock; i < (kb + 1) * kBlock; ++i)
            block += static_cast<double>(a_row[i]) * b_row[i];
          sum += block * in.a_scales[static_cast<std::size_t>(kb) * in.ld + r] * b_scale[kb];
        }
        d[static_cast<std::size_t>(r) * in.n + c] = static_cast<float>(sum);
      }
  return d;
}

// Every value of the rows below `rows` is a number close to the reference;
// every value from `rows` to the capacity still holds the poison.
// Metric: relative L2 < 1e-2, per row and over the whole output. The bf16
// output rounding is at most 2^-9 of each value (about 2e-3 of a norm at
// worst, less on average). The tensor cores sum each 128-deep block with
// about 14 significant bits before it is scaled into fp32 (the reason for
// promoting per block), a few 1e-4 of a block's sum, up to ~1e-3 if the
// truncations all lean one way; the fp32 scale products and accumulators add
// ~1e-7. A wrong row, group, column or scale gives errors of order 1.
void expect_gemm_output(const std::vector<uint16_t>& d_bits, const std::vector<float>& ref,
                        int rows, int n) {
  std::vector<float> d(static_cast<std::size_t>(rows) * n);
  int nans = 0, bad_rows = 0;
  for (std::size_t i = 0; i < d.size(); ++i) {
    d[i] = ref::bf16_to_f32(d_bits[i]);
    nans += std::isnan(d[i]);
  }
  for (int r = 0; r < rows; ++r) {
    const std::size_t at = static_cast<std::size_t>(r) * n;
    bad_rows += !(rel_l2(&d[at], &ref[at], n) < 1e-2);
  }
  EXPECT_EQ(nans, 0) << "NaN (or unwritten) values in rows < " << rows;
  EXPECT_EQ(bad_rows, 0) << "rows with relative L2 error >= 1e-2";
  if (rows > 0) EXPECT_LT(rel_l2(d, ref), 1e-2);
  const auto past = std::find_if(d_bits.begin() + static_cast<std::ptrdiff_t>(d.size()),
                                 d_bits.end(), [](uint16_t v) { return v != kPoison; });
  EXPECT_TRUE(past == d_bits.end()) << "row " << (past - d_bits.begin()) / n
                                    << " beyond the valid rows was written";
}

// ------------------------------------------------------------ grouped GEMM ----

struct Fp8Case {
  std::vector<int> counts;  // rows of each group
  int n, k;
};

std::string label(const Fp8Case& c) {
  std::string s = "counts={";
  for (std::size_t g = 0; g < c.counts.size(); ++g)
    s += (g ? "," : "") + std::to_string(c.counts[g]);
  return s + "} n=" + std::to_string(c.n) + " k=" + std::to_string(c.k);
}

// gtest prints parameters (and ctest names the tests) with this.
void PrintTo(const Fp8Case& c, std::ostream* os) { *os << label(c); }

class Sm90Fp8GroupedGemmTest : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(Sm90Fp8GroupedGemmTest, MatchesHostLoopForEveryTactic) {
  UNIMOE_REQUIRE_GPU();
  const Fp8Case c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " " + label(c));
  std::mt19937_64 rng(seed);

  const std::vector<int32_t> offsets = offsets_of(c.counts);
  const int rows = offsets.back();
  const int capacity = rows + 37;  // rows past the count must stay untouched
  Fp8Inputs in(static_cast<int>(c.counts.size()), c.n, c.k, capacity, rng);
  in.offsets_dev.upload(offsets);
  const std::vector<float> ref = reference_gemm(in, offsets);

  for (Sm90Fp8GemmTactic tactic : kSm90Fp8GemmTactics) {
    SCOPED_TRACE(std::string("tactic ") + to_string(tactic));
    in.d_dev.poison();
    launch_sm90_fp8_grouped_gemm(in.params(tactic), nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    expect_gemm_output(in.d_dev.download(), ref, rows, c.n);
    // The fp32 D: no output rounding, so within the tensor cores' block sums
    // (a few 1e-4, above); 2e-3 leaves room. Rows past the count keep the poison.
    Sm90Fp8GroupedGemmParams f = in.params(tactic);
    f.d = nullptr;
    f.d_f32 = in.d_f32_dev.get();
    in.d_f32_dev.poison();
    launch_sm90_fp8_grouped_gemm(f, nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> d32 = in.d_f32_dev.download();
    const std::vector<float> live(d32.begin(), d32.begin() + static_cast<std::ptrdiff_t>(rows) * c.n);
    if (rows > 0) EXPECT_LT(rel_l2(live, ref), 2e-3) << "fp32 D";
    int written_past = 0;
    for (std::size_t i = live.size(); i < d32.size(); ++i) written_past += !std::isnan(d32[i]);
    EXPECT_EQ(written_past, 0) << "fp32 D: values beyond the valid rows were written";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Sm90Fp8GroupedGemmTest,
    ::testing::Values(
        Fp8Case{{0, 1, 3, 17, 0, 130, 257, 0}, 128, 128},  // odd counts, first and last empty
        Fp8Case{{0, 1, 3, 17, 0, 130, 257, 0}, 384, 512},  // three N blocks, four K blocks
        Fp8Case{{257, 0, 17, 1, 130, 3}, 176, 896},        // ragged last N block, K = 7168 / 8
        Fp8Case{{0, 0, 0, 300, 0}, 384, 896},              // one hot group takes every row
        Fp8Case{{1}, 16, 128},                             // the smallest problem
        Fp8Case{{0, 0, 0}, 128, 256}));                    // no rows at all

TEST(Sm90Fp8GroupedGemm, GraphReplayServesNewOffsets) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int kGroups = 6, kN = 176, kK = 512, kCapacity = 512;
  Fp8Inputs in(kGroups, kN, kK, kCapacity, rng);
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  for (Sm90Fp8GemmTactic tactic : kSm90Fp8GemmTactics) {
    SCOPED_TRACE(std::string("tactic ") + to_string(tactic));
    cudaGraph_t graph;
    graph = test::capture(stream, cudaStreamCaptureModeGlobal, [&] {
      launch_sm90_fp8_grouped_gemm(in.params(tactic), stream);
    });
    cudaGraphExec_t exec;
    UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    // Same buffers, a new routing each replay: odd and empty groups, then a
    // different split with the first group hot.
    for (const std::vector<int>& counts :
         {std::vector<int>{0, 5, 130, 0, 257, 1}, std::vector<int>{300, 0, 0, 17, 3, 0}}) {
      const std::vector<int32_t> offsets = offsets_of(counts);
      SCOPED_TRACE("rows " + std::to_string(offsets.back()));
      in.offsets_dev.upload(offsets);
      in.d_dev.poison();
      // The poison runs on the legacy stream, which `stream` does not wait for.
      UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
      UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      expect_gemm_output(in.d_dev.download(), reference_gemm(in, offsets), offsets.back(), kN);
    }
    UNIMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
    UNIMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  UNIMOE_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(Sm90Fp8GroupedGemm, TacticsPrintTheirNames) {
  UNIMOE_REQUIRE_GPU();
  EXPECT_STREQ(to_string(Sm90Fp8GemmTactic::Cooperative128x128), "fp8_coop_128x128x128");
  EXPECT_STREQ(to_string(Sm90Fp8GemmTactic::Pingpong64x128), "fp8_pingpong_64x128x128");
  EXPECT_STREQ(to_string(Sm90Fp8GemmTactic::Cooperative128x128Cluster2x1), "fp8_coop_128x128x128_c2x1");
}

// Each bad field is refused with std::invalid_argument naming it, before
// anything is launched.
TEST(Sm90Fp8GroupedGemm, RejectsBadParameters) {
  UNIMOE_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  Fp8Inputs in(2, 128, 256, 8, rng);
  using Edit = std::function<void(Sm90Fp8GroupedGemmParams&)>;
  const std::pair<Edit, std::string> cases[] = {
      {[](auto& p) { p.n = 72; }, "n must"},
      {[](auto& p) { p.n = 0; }, "n must"},
      {[](auto& p) { p.k = 192; }, "k must"},
      {[](auto& p) { p.a_scales_ld = 10; }, "a_scales_ld"},
      {[](auto& p) { p.a_scales_ld = 0; }, "a_scales_ld"},
      {[](auto& p) { p.a = nullptr; }, "a is null"},
      {[](auto& p) { p.a_scales = nullptr; }, "a_scales is null"},
      {[](auto& p) { p.b_scales = nullptr; }, "b_scales is null"},
      {[](auto& p) { p.expert_offsets = nullptr; }, "expert_offsets is null"},
      {[](auto& p) { p.d += 1; }, "d must be 16-byte aligned"},
      {[](auto& p) { p.b += 8; }, "b must be 16-byte aligned"},
      {[](auto& p) { p.a_scales = reinterpret_cast<const float*>(
                         reinterpret_cast<const char*>(p.a_scales) + 2); }, "a_scales must be"},
      {[](auto& p) { p.workspace = static_cast<char*>(p.workspace) + 64; }, "workspace must"},
  };
  for (const auto& [edit, field] : cases) {
    Sm90Fp8GroupedGemmParams p = in.params(Sm90Fp8GemmTactic::Cooperative128x128);
    edit(p);
    try {
      launch_sm90_fp8_grouped_gemm(p, nullptr);
      ADD_FAILURE() << "accepted: " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace unimoe::test
