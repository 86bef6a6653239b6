// GPU tests of the sm90 CUTLASS grouped GEMM (every tactic, device-only row
// counts, CUDA-graph replay) and of the gather and activation row kernels
// around it, each against a plain host loop.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "core/hash_random.h"
#include "gpu/gpu_test_util.h"
#include "kernels/permute/expert_rows.cuh"
#include "kernels/common/fill.cuh"
#include "kernels/gemm/sm90_grouped_gemm.cuh"
#include "ref/ref.h"

namespace unimoe::test {
namespace {

constexpr uint16_t kPoison = 0xffff;  // DeviceBuffer::poison(): a bf16 NaN

int device_sm_count() {
  int count = 0;
  UNIMOE_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, 0));
  return count;
}

// The values launch_fill_bf16(seed, scale) writes, regenerated on the host.
std::vector<float> fill_values(std::size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = ref::round_bf16(hash_uniform(seed, i) * scale);
  return v;
}

std::vector<int32_t> offsets_of(const std::vector<int>& counts) {
  std::vector<int32_t> offsets(counts.size() + 1, 0);
  for (std::size_t g = 0; g < counts.size(); ++g) offsets[g + 1] = offsets[g] + counts[g];
  return offsets;
}

// `rows` rows over `groups` groups: about a quarter of the groups empty
// (group 1 always), group 0 an odd count, the rest random.
std::vector<int> random_counts(int groups, int rows, std::mt19937_64& rng) {
  std::vector<double> share(groups, 0.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int g = 0; g < groups; ++g) share[g] = (g == 1 || u(rng) < 0.25) ? 0.0 : u(rng) + 0.05;
  if (share[0] == 0.0) share[0] = 0.5;
  double sum = 0;
  for (double s : share) sum += s;
  std::vector<int> counts(groups, 0);
  int given = 0;
  for (int g = 0; g < groups; ++g) {
    counts[g] = static_cast<int>(rows * share[g] / sum);
    given += counts[g];
  }
  counts[0] += rows - given;  // the remainder, so that the total is exact
  if (counts[0] % 2 == 0 && counts[0] > 0 && groups > 2) {
    // Make group 0 odd by moving one row to the first other non-empty group.
    for (int g = 2; g < groups; ++g)
      if (counts[g] > 0) { --counts[0]; ++counts[g]; break; }
  }
  return counts;
}

// D [rows, n] in fp64 (stored as float): D[r, c] = sum_k A[r, k] * B[g(r)][c, k].
std::vector<float> reference_gemm(const std::vector<float>& a, const std::vector<float>& b,
                                  const std::vector<int32_t>& offsets, int n, int k) {
  const int groups = static_cast<int>(offsets.size()) - 1;
  std::vector<float> d(static_cast<std::size_t>(offsets.back()) * n);
  for (int g = 0; g < groups; ++g)
    for (int r = offsets[g]; r < offsets[g + 1]; ++r) {
      const float* a_row = &a[static_cast<std::size_t>(r) * k];
      for (int c = 0; c < n; ++c) {
        const float* b_row = &b[(static_cast<std::size_t>(g) * n + c) * k];
        double acc[4] = {0, 0, 0, 0};  // k is a multiple of 8
        for (int i = 0; i < k; i += 4)
          for (int j = 0; j < 4; ++j) acc[j] += static_cast<double>(a_row[i + j]) * b_row[i + j];
        d[static_cast<std::size_t>(r) * n + c] = static_cast<float>(acc[0] + acc[1] + acc[2] + acc[3]);
      }
    }
  return d;
}

// Every row below `rows` is written and close to the reference; every row
// from `rows` to the capacity still holds the poison.
// Metric: relative L2 < 1e-2, over the whole output and per row. The only
// roundings are the fp32 accumulation (~1e-6 relative) and the bf16 output
// (at most 2^-9 = 0.2% of each value, so at most 0.2% of a row's norm); a
// wrong row, expert or column gives errors of order 1.
void expect_gemm_output(const std::vector<uint16_t>& d_bits, const std::vector<float>& ref,
                        int rows, int n) {
  std::vector<float> d(static_cast<std::size_t>(rows) * n);
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = ref::bf16_to_f32(d_bits[i]);
  int unwritten = 0, bad_rows = 0;
  for (int r = 0; r < rows; ++r) {
    const std::size_t at = static_cast<std::size_t>(r) * n;
    for (int c = 0; c < n; ++c) unwritten += d_bits[at + c] == kPoison;
    bad_rows += !(rel_l2(&d[at], &ref[at], n) < 1e-2);
  }
  EXPECT_EQ(unwritten, 0) << "values of rows < " << rows << " still poisoned";
  EXPECT_EQ(bad_rows, 0) << "rows with relative L2 error >= 1e-2";
  if (rows > 0) EXPECT_LT(rel_l2(d, ref), 1e-2);
  const auto past = std::find_if(d_bits.begin() + static_cast<std::ptrdiff_t>(d.size()), d_bits.end(),
                                 [](uint16_t v) { return v != kPoison; });
  EXPECT_TRUE(past == d_bits.end()) << "row " << (past - d_bits.begin()) / n
                                    << " beyond the valid rows was written";
}

// Device inputs of one grouped GEMM: A [capacity, k], B [groups, n, k] from
// launch_fill_bf16, and their host copies.
struct GemmInputs {
  int groups = 0, n = 0, k = 0, capacity = 0;
  std::vector<float> a, b;
  DeviceBuffer<uint16_t> a_dev, b_dev, d_dev;
  DeviceBuffer<int32_t> offsets_dev;
  DeviceBuffer<uint8_t> workspace;

  GemmInputs(int groups_, int n_, int k_, int capacity_, uint64_t seed)
      : groups(groups_), n(n_), k(k_), capacity(capacity_),
        a_dev(static_cast<std::size_t>(capacity_) * k_),
        b_dev(static_cast<std::size_t>(groups_) * n_ * k_),
        d_dev(static_cast<std::size_t>(capacity_) * n_),
        offsets_dev(groups_ + 1),
        workspace(sm90_grouped_gemm_workspace_bytes(groups_, device_sm_count())) {
    workspace.poison(0);  // zeroed once, as the contract asks
    const uint64_t seed_a = hash64(seed ^ 0xa), seed_b = hash64(seed ^ 0xb);
    launch_fill_bf16(a_dev.get(), a_dev.size(), seed_a, 1.0f, nullptr);
    launch_fill_bf16(b_dev.get(), b_dev.size(), seed_b, 1.0f, nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    a = fill_values(a_dev.size(), seed_a, 1.0f);
    b = fill_values(b_dev.size(), seed_b, 1.0f);
  }

  Sm90GroupedGemmParams params(Sm90GemmTactic tactic) const {
    Sm90GroupedGemmParams p;
    p.a = a_dev.get();
    p.expert_offsets = offsets_dev.get();
    p.b = b_dev.get();
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

std::vector<Sm90GemmTactic> all_tactics() {
  int count = 0;
  const Sm90GemmTactic* t = sm90_gemm_tactics(&count);
  return {t, t + count};
}

// ------------------------------------------------------------ grouped GEMM ----

enum class Rows { Random, OneGroup, None };

struct GemmCase {
  int groups, rows, n, k;
  Rows kind;
};

std::string label(const GemmCase& c) {
  const char* kinds[] = {"random", "one_group", "none"};
  return "G=" + std::to_string(c.groups) + " rows=" + std::to_string(c.rows) +
         " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) + " " +
         kinds[static_cast<int>(c.kind)];
}

// gtest prints parameters (and ctest names the tests) with this.
void PrintTo(const GemmCase& c, std::ostream* os) { *os << label(c); }

class Sm90GroupedGemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(Sm90GroupedGemmTest, MatchesHostLoopForEveryTactic) {
  UNIMOE_REQUIRE_GPU();
  const GemmCase c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " " + label(c));
  std::mt19937_64 rng(seed);

  std::vector<int> counts(c.groups, 0);
  if (c.kind == Rows::Random) counts = random_counts(c.groups, c.rows, rng);
  if (c.kind == Rows::OneGroup) counts[c.groups / 2] = c.rows;
  const std::vector<int32_t> offsets = offsets_of(counts);
  const int rows = offsets.back();
  const int capacity = rows + 37;  // rows past the count must stay untouched

  GemmInputs in(c.groups, c.n, c.k, capacity, seed);
  in.offsets_dev.upload(offsets);
  const std::vector<float> ref = reference_gemm(in.a, in.b, offsets, c.n, c.k);

  for (Sm90GemmTactic tactic : all_tactics()) {
    SCOPED_TRACE("tactic " + to_string(tactic));
    EXPECT_EQ(parse_sm90_gemm_tactic(to_string(tactic)), tactic);
    in.d_dev.poison();
    launch_sm90_grouped_gemm(in.params(tactic), nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    expect_gemm_output(in.d_dev.download(), ref, rows, c.n);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Sm90GroupedGemmTest,
    ::testing::Values(GemmCase{8, 701, 136, 72, Rows::Random},     // N, K off the tile sizes
                      GemmCase{6, 517, 264, 200, Rows::OneGroup},  // one expert takes every row
                      GemmCase{1, 1, 8, 8, Rows::Random},          // the smallest problem
                      GemmCase{130, 1200, 64, 64, Rows::Random},   // > 32 groups: scheduler search
                      GemmCase{5, 0, 128, 64, Rows::None},         // no rows at all
                      GemmCase{8, 300, 1536, 2048, Rows::Random},  // anchor GEMM1 (N = 2I)
                      GemmCase{8, 600, 2048, 768, Rows::Random})); // anchor GEMM2

TEST(Sm90GroupedGemm, GraphReplayServesNewOffsets) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int kGroups = 8, kN = 264, kK = 136, kCapacity = 640;
  GemmInputs in(kGroups, kN, kK, kCapacity, seed);
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  for (Sm90GemmTactic tactic : all_tactics()) {
    SCOPED_TRACE("tactic " + to_string(tactic));
    cudaGraph_t graph;
    graph = test::capture(stream, cudaStreamCaptureModeGlobal, [&] {
      launch_sm90_grouped_gemm(in.params(tactic), stream);
    });
    cudaGraphExec_t exec;
    UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    // Same buffers, new routing each replay: a full one, a smaller one, one hot group.
    for (int rows : {kCapacity, 421, 250}) {
      std::vector<int> counts(kGroups, 0);
      if (rows == 250) counts[kGroups - 1] = rows;
      else counts = random_counts(kGroups, rows, rng);
      const std::vector<int32_t> offsets = offsets_of(counts);
      SCOPED_TRACE("rows " + std::to_string(rows));
      in.offsets_dev.upload(offsets);
      in.d_dev.poison();
      // The poison runs on the legacy stream, which `stream` does not wait for.
      UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
      UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      expect_gemm_output(in.d_dev.download(), reference_gemm(in.a, in.b, offsets, kN, kK), rows, kN);
    }
    UNIMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
    UNIMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  UNIMOE_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------- row kernels ----

// Random routing of T tokens over E experts, of which [local_offset,
// local_offset + num_local) are on this rank, so some rows are off rank and
// the permuted row count is below the capacity.
ref::Permutation random_permutation(int tokens, int top_k, int experts, int local_offset,
                                    int num_local, std::mt19937_64& rng) {
  std::vector<int32_t> ids;
  std::vector<int32_t> pool(experts);
  for (int e = 0; e < experts; ++e) pool[e] = e;
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    ids.insert(ids.end(), pool.begin(), pool.begin() + top_k);
  }
  return ref::permute(ids.data(), tokens, top_k, local_offset, num_local);
}

std::vector<uint16_t> random_bf16(std::size_t n, float scale, std::mt19937_64& rng) {
  std::vector<uint16_t> v(n);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (auto& x : v) x = ref::f32_to_bf16(u(rng));
  return v;
}

// The inputs of a row-kernel test: a random routing (random_permutation)
// and random x rows [tokens, hidden].
struct RowsCase {
  ref::Permutation perm;
  std::vector<uint16_t> x;
  int capacity = 0;  // tokens * top_k
  int rows = 0;      // permuted rows on this rank
};

RowsCase make_rows_case(int tokens, int top_k, int hidden, int experts, int local_offset, int num_local,
                        std::mt19937_64& rng) {
  RowsCase r;
  r.capacity = tokens * top_k;
  r.perm = random_permutation(tokens, top_k, experts, local_offset, num_local, rng);
  r.rows = r.perm.expert_offsets.back();
  r.x = random_bf16(static_cast<std::size_t>(tokens) * hidden, 4.0f, rng);
  return r;
}

// out [capacity, hidden] after a gather or a scatter: permuted row r <
// expert_offsets.back() holds the row of token permuted_to_expanded[r] /
// top_k of x, every later row still the poison.
void expect_token_rows(const std::vector<uint16_t>& got, const std::vector<uint16_t>& x,
                       const ref::Permutation& perm, int top_k, int hidden, int capacity) {
  const int rows = perm.expert_offsets.back();
  int mismatches = 0, written_past = 0;
  for (int r = 0; r < capacity; ++r)
    for (int c = 0; c < hidden; ++c) {
      const uint16_t v = got[static_cast<std::size_t>(r) * hidden + c];
      if (r < rows) {
        const int token = perm.permuted_to_expanded[r] / top_k;
        mismatches += v != x[static_cast<std::size_t>(token) * hidden + c];
      } else {
        written_past += v != kPoison;
      }
    }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(written_past, 0);
}

TEST(ExpertRows, GatherCopiesTokenRowsExactly) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int kTokens = 37, kTopK = 3, kHidden = 136, kLocal = 5;
  const RowsCase rc = make_rows_case(kTokens, kTopK, kHidden, 8, 2, kLocal, rng);
  const ref::Permutation& perm = rc.perm;
  const std::vector<uint16_t>& x = rc.x;
  const int capacity = rc.capacity;
  ASSERT_LT(rc.rows, capacity);  // some rows are off rank

  DeviceBuffer<uint16_t> x_dev(x), out(static_cast<std::size_t>(capacity) * kHidden);
  DeviceBuffer<int32_t> p2e(capacity), offsets(perm.expert_offsets);
  p2e.poison();  // entries past the count are never read
  p2e.upload(perm.permuted_to_expanded);
  out.poison();

  GatherRowsParams p;
  p.x = x_dev.get();
  p.permuted_to_expanded = p2e.get();
  p.expert_offsets = offsets.get();
  p.num_groups = kLocal;
  p.top_k = kTopK;
  p.hidden = kHidden;
  p.capacity = capacity;
  p.out = out.get();
  launch_gather_rows(p, nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());

  expect_token_rows(out.download(), x, perm, kTopK, kHidden, capacity);
}

// The scatter form writes the gather's rows with the gather's values: each
// token row to the permuted rows of its on-rank expanded rows (off-rank
// ones, -1, skipped), no other row (the poison past the live count stays).
TEST(ExpertRows, ScatterWritesTheGathersRows) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int kTokens = 45, kTopK = 4, kHidden = 264, kLocal = 5;
  const RowsCase rc = make_rows_case(kTokens, kTopK, kHidden, 9, 3, kLocal, rng);
  const ref::Permutation& perm = rc.perm;
  const std::vector<uint16_t>& x = rc.x;
  const int capacity = rc.capacity;
  ASSERT_LT(rc.rows, capacity);  // some rows are off rank

  DeviceBuffer<uint16_t> x_dev(x), out(static_cast<std::size_t>(capacity) * kHidden);
  DeviceBuffer<int32_t> e2p(perm.expanded_to_permuted);
  out.poison();

  ScatterRowsParams p;
  p.x = x_dev.get();
  p.expanded_to_permuted = e2p.get();
  p.num_tokens = kTokens;
  p.top_k = kTopK;
  p.hidden = kHidden;
  p.out = out.get();
  launch_scatter_rows(p, nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());

  expect_token_rows(out.download(), x, perm, kTopK, kHidden, capacity);

  // No token: nothing launched, nothing written.
  out.poison();
  p.num_tokens = 0;
  launch_scatter_rows(p, nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> untouched = out.download();
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](uint16_t v) { return v == kPoison; }));
}

// bf16 bits as an integer that counts ulps monotonically (+0 and -0 alike).
int ordered(uint16_t bits) { return (bits & 0x8000) ? -(bits & 0x7fff) : (bits & 0x7fff); }

struct ActivationCase {
  Activation activation;
  bool bias;
  int intermediate;
};

void PrintTo(const ActivationCase& c, std::ostream* os) {
  *os << to_string(c.activation) << (c.bias ? " bias" : "") << " I=" << c.intermediate;
}

class GatedActivationTest : public ::testing::TestWithParam<ActivationCase> {};

// Metric: within 1 bf16 ulp of the fp64 reference applied to the same fp32
// inputs (bf16 h plus the fp32 bias, added in fp32 as on the device). The
// device's expf/erff carry a few fp32 ulps of error, which can move the bf16
// rounding across one boundary, never two.
TEST_P(GatedActivationTest, MatchesHostWithinOneUlp) {
  UNIMOE_REQUIRE_GPU();
  const ActivationCase c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " " + to_string(c.activation) +
               (c.bias ? " bias" : "") + " I=" + std::to_string(c.intermediate));
  std::mt19937_64 rng(seed);
  constexpr int kGroups = 6;
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;
  const bool gated = c.activation != Activation::ReLU2;
  const int inter = c.intermediate, cols = gated ? 2 * inter : inter;
  const std::vector<int32_t> offsets = offsets_of(random_counts(kGroups, 203, rng));
  const int rows = offsets.back(), capacity = rows + 9;

  // |h| up to 10 crosses the SwiGLUOai limits. GeGLU stays within |g| <= 5.5,
  // where the reference's fp64 1 + erf(x) keeps 8 significant digits; below
  // about g = -8 it cancels to nothing. The bias differs per expert.
  const float h_scale = c.activation == Activation::GeGLU ? 3.5f : 10.0f;
  const std::vector<uint16_t> h = random_bf16(static_cast<std::size_t>(capacity) * cols, h_scale, rng);
  const std::vector<float> b13 = random_vector(static_cast<std::size_t>(kGroups) * cols, rng, -2, 2);
  DeviceBuffer<uint16_t> h_dev(h), out(static_cast<std::size_t>(capacity) * inter);
  DeviceBuffer<float> b13_dev(b13);
  DeviceBuffer<int32_t> offsets_dev(offsets);
  out.poison();

  GatedActivationParams p;
  p.h = h_dev.get();
  p.b13 = c.bias ? b13_dev.get() : nullptr;
  p.expert_offsets = offsets_dev.get();
  p.num_groups = kGroups;
  p.capacity = capacity;
  p.intermediate = inter;
  p.activation = c.activation;
  p.swiglu_alpha = kAlpha;
  p.swiglu_limit = kLimit;
  p.out = out.get();
  launch_gated_activation(p, nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<uint16_t> got = out.download();
  int off_by_more = 0, off_by_one = 0, written_past = 0;
  for (int g = 0; g < kGroups; ++g)
    for (int r = offsets[g]; r < offsets[g + 1]; ++r)
      for (int j = 0; j < inter; ++j) {
        const std::size_t at = static_cast<std::size_t>(r) * cols + j;
        auto input = [&](int col) {
          const float v = ref::bf16_to_f32(h[at + col]);
          return c.bias ? v + b13[static_cast<std::size_t>(g) * cols + j + col] : v;
        };
        const float gate = input(0), up = gated ? input(inter) : 0.0f;
        const double want = ref::activate(c.activation, gate, up, kAlpha, kLimit);
        const uint16_t want_bits = ref::f32_to_bf16(static_cast<float>(want));
        const int diff = std::abs(ordered(got[static_cast<std::size_t>(r) * inter + j]) -
                                  ordered(want_bits));
        off_by_more += diff > 1;
        off_by_one += diff == 1;
      }
  for (std::size_t i = static_cast<std::size_t>(rows) * inter; i < got.size(); ++i)
    written_past += got[i] != kPoison;
  EXPECT_EQ(off_by_more, 0) << "values more than 1 ulp from the reference";
  EXPECT_LE(off_by_one, rows * inter / 20) << "too many values 1 ulp off";
  EXPECT_EQ(written_past, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Activations, GatedActivationTest,
    ::testing::Values(ActivationCase{Activation::SwiGLU, false, 72},
                      ActivationCase{Activation::SwiGLU, true, 264},
                      ActivationCase{Activation::GeGLU, false, 264},
                      ActivationCase{Activation::GeGLU, true, 72},
                      ActivationCase{Activation::SwiGLUOai, true, 264},
                      ActivationCase{Activation::SwiGLUOai, false, 72},
                      ActivationCase{Activation::ReLU2, false, 264},
                      ActivationCase{Activation::ReLU2, true, 72}));

}  // namespace
}  // namespace unimoe::test
