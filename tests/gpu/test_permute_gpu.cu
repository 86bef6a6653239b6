// Sort/permute kernels against the CPU reference (ref::permute,
// ref::make_tiles): counts, offsets, both row maps and every tile schedule
// exact, on random routing, expert-parallel ranges with off-rank rows, empty
// experts, one hot expert, large T*K and T = 0; and routing + permute
// captured once in a CUDA graph and replayed on new logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "gpu/routing_plan_util.h"
#include "gpu/routing_test_util.h"
#include "core/routing_limits.h"
#include "kernels/permute/permute.cuh"
#include "kernels/routing/routing.cuh"
#include "ref/ref.h"

namespace unimoe {
namespace {

// The permute chain's plan for given ids (no routing kernel) of `rows`
// expanded rows, as plan_routing makes it: `counted` where a routing
// kernel wrote the chunk counts (the scatter then ranks by token masks).
RoutingPlan chain_plan(int rows, int num_local, bool counted = false) {
  RoutingPlan plan;
  plan.variant = RoutingVariant::Split;
  plan.kernel = RoutingKernel::None;
  plan.permute_chunks = std::max(permute_chunks::num_chunks(rows), 1);
  plan.routing_counts_rows = counted;
  plan.scatter_masks = counted;
  plan.scan_triggers_scatter =
      counted || plan.permute_chunks + (num_local + 31) / 32 <= current_device_sm_count();
  return plan;
}

using test::DeviceBuffer;

constexpr int kExperts[] = {8, 64, 128, 160, 256, 384, 1024};
constexpr int kTopKs[] = {1, 2, 4, 6, 8, 22, 32};
constexpr int kTokens[] = {1, 2, 3, 7, 33, 100, 1000, 4096};

// K distinct experts per token, uniformly drawn from [0, num_experts).
std::vector<int32_t> random_ids(int num_tokens, int top_k, int num_experts, std::mt19937_64& rng) {
  std::vector<int32_t> all(num_experts), ids;
  std::iota(all.begin(), all.end(), 0);
  ids.reserve(static_cast<std::size_t>(num_tokens) * top_k);
  for (int t = 0; t < num_tokens; ++t) {
    for (int k = 0; k < top_k; ++k) {  // partial Fisher-Yates: the first K are a random draw
      std::uniform_int_distribution<int> pick(k, num_experts - 1);
      std::swap(all[k], all[pick(rng)]);
      ids.push_back(all[k]);
    }
  }
  return ids;
}

// Device outputs of one launch_permute, sized for (T, K, E_local, tile sizes).
class PermuteBuffers {
 public:
  PermuteBuffers(int num_tokens, int top_k, int num_local, std::vector<int> tile_m)
      : num_tokens_(num_tokens),
        top_k_(top_k),
        num_local_(num_local),
        tile_m_(std::move(tile_m)),
        counts_(num_local),
        offsets_(num_local + 1),
        permuted_to_expanded_(static_cast<std::size_t>(num_tokens) * top_k),
        expanded_to_permuted_(static_cast<std::size_t>(num_tokens) * top_k),
        num_tiles_(kMaxTileSizes),
        scratch_(permute_scratch_bytes(num_tokens, top_k, num_local)) {
    for (std::size_t s = 0; s < tile_m_.size(); ++s)
      tiles_[s] = DeviceBuffer<DeviceTile>(max_tiles(num_tokens * top_k, num_local, tile_m_[s]));
  }

  void poison() {
    counts_.poison();
    offsets_.poison();
    permuted_to_expanded_.poison();
    expanded_to_permuted_.poison();
    num_tiles_.poison();
    for (std::size_t s = 0; s < tile_m_.size(); ++s) tiles_[s].poison();
    scratch_.poison();  // the kernels must not rely on zeroed scratch
  }

  PermuteParams params(const int32_t* topk_ids, int local_offset) const {
    PermuteParams p;
    p.topk_ids = topk_ids;
    p.num_tokens = num_tokens_;
    p.top_k = top_k_;
    p.local_offset = local_offset;
    p.num_local = num_local_;
    p.expert_counts = counts_.get();
    p.expert_offsets = offsets_.get();
    p.permuted_to_expanded = permuted_to_expanded_.get();
    p.expanded_to_permuted = expanded_to_permuted_.get();
    p.num_tile_sizes = static_cast<int>(tile_m_.size());
    for (std::size_t s = 0; s < tile_m_.size(); ++s) {
      p.tile_m[s] = tile_m_[s];
      p.tiles[s] = tiles_[s].get();
      p.num_tiles[s] = num_tiles_.get() + s;
    }
    p.scratch = scratch_.get();
    return p;
  }

  // Every output against the reference for `ids` (host copy of the input).
  void expect_matches_reference(const std::vector<int32_t>& ids, int local_offset) const {
    const ref::Permutation want =
        ref::permute(ids.data(), num_tokens_, top_k_, local_offset, num_local_);
    EXPECT_EQ(counts_.download(), want.expert_counts);
    EXPECT_EQ(offsets_.download(), want.expert_offsets);
    std::vector<int32_t> p2e = permuted_to_expanded_.download();
    p2e.resize(want.permuted_to_expanded.size());  // only the on-rank rows are defined
    EXPECT_EQ(p2e, want.permuted_to_expanded);
    EXPECT_EQ(expanded_to_permuted_.download(), want.expanded_to_permuted);

    const std::vector<int32_t> num_tiles = num_tiles_.download();
    for (std::size_t s = 0; s < tile_m_.size(); ++s) {
      SCOPED_TRACE("tile_m " + std::to_string(tile_m_[s]));
      const std::vector<ref::Tile> want_tiles = ref::make_tiles(want, tile_m_[s]);
      ASSERT_EQ(num_tiles[s], static_cast<int32_t>(want_tiles.size()));
      const std::vector<DeviceTile> got = tiles_[s].download();
      int errors = 0;
      std::string first;
      for (std::size_t i = 0; i < want_tiles.size(); ++i) {
        const ref::Tile& w = want_tiles[i];
        if (got[i].expert != w.expert || got[i].row_start != w.row_start || got[i].rows != w.rows) {
          if (errors++ == 0)
            first = "tile " + std::to_string(i) + ": (" + std::to_string(got[i].expert) + ", " +
                    std::to_string(got[i].row_start) + ", " + std::to_string(got[i].rows) +
                    ") want (" + std::to_string(w.expert) + ", " + std::to_string(w.row_start) +
                    ", " + std::to_string(w.rows) + ")";
        }
      }
      EXPECT_EQ(errors, 0) << first;
    }
  }

 private:
  int num_tokens_, top_k_, num_local_;
  std::vector<int> tile_m_;
  DeviceBuffer<int32_t> counts_, offsets_, permuted_to_expanded_, expanded_to_permuted_;
  DeviceBuffer<int32_t> num_tiles_;
  DeviceBuffer<uint8_t> scratch_;
  DeviceBuffer<DeviceTile> tiles_[kMaxTileSizes];
};

// Uploads ids, runs launch_permute on poisoned outputs, compares.
void check_permute(const std::vector<int32_t>& ids, int num_tokens, int top_k, int local_offset,
                   int num_local, const std::vector<int>& tile_m) {
  SCOPED_TRACE("T=" + std::to_string(num_tokens) + " K=" + std::to_string(top_k) +
               " local [" + std::to_string(local_offset) + ", " +
               std::to_string(local_offset + num_local) + ")");
  DeviceBuffer<int32_t> d_ids;
  if (!ids.empty()) d_ids = DeviceBuffer<int32_t>(ids);
  PermuteBuffers buffers(num_tokens, top_k, num_local, tile_m);
  buffers.poison();
  launch_permute(buffers.params(d_ids.get(), local_offset), chain_plan(num_tokens * top_k, num_local),
                 nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  buffers.expect_matches_reference(ids, local_offset);
}

TEST(PermuteGpu, RandomRoutingMatchesReference) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int case_index = 0;
  for (int e : kExperts) {
    for (int k : kTopKs) {
      if (k > e) continue;
      for (int repeat = 0; repeat < 2; ++repeat) {
        const int t = kTokens[case_index++ % std::size(kTokens)];
        SCOPED_TRACE("E=" + std::to_string(e));
        check_permute(random_ids(t, k, e, rng), t, k, 0, e, {16, 64, 128});
      }
    }
  }
}

TEST(PermuteGpu, ChunkBoundaries) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // T*K just below, at and above whole chunks, and many chunks with a partial last one.
  const std::pair<int, int> shapes[] = {{255, 1},  {256, 1},  {257, 1},   {1023, 1},
                                        {1024, 1}, {1025, 1}, {128, 8},   {129, 8},
                                        {1000, 6}, {5000, 22}, {16383, 32},
                                        {256, 8},  {257, 8},    // 2048 rows: one count + scan launch up to here
                                        {2048, 8}, {2049, 8}};  // 16384 rows: the small-call rule's edge
  for (auto [t, k] : shapes)
    check_permute(random_ids(t, k, 64, rng), t, k, 0, 64, {1, 64, 128});
}

TEST(PermuteGpu, ExpertParallelRangeWithOffRankRows) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int t : {1, 33, 1000, 4096}) {
    const std::vector<int32_t> ids = random_ids(t, 8, 256, rng);
    const std::pair<int, int> ranges[] = {{0, 32}, {64, 32}, {224, 32}, {100, 1}, {1, 255}};
    for (auto [offset, count] : ranges)
      check_permute(ids, t, 8, offset, count, {1, 7, 128});
  }
  const std::vector<int32_t> wide = random_ids(1000, 32, 1024, rng);
  check_permute(wide, 1000, 32, 512, 512, {16, 64, 128});
}

TEST(PermuteGpu, EmptyExperts) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Only even experts, and only the last three of 384, are ever chosen.
  std::vector<int32_t> even = random_ids(1000, 4, 192, rng);
  for (int32_t& id : even) id *= 2;
  check_permute(even, 1000, 4, 0, 384, {16, 64, 128});
  std::vector<int32_t> last = random_ids(700, 2, 3, rng);
  for (int32_t& id : last) id += 381;
  check_permute(last, 700, 2, 0, 384, {16, 64, 128});
  // Every row off this rank.
  check_permute(random_ids(100, 8, 64, rng), 100, 8, 64, 64, {16});
}

TEST(PermuteGpu, OneHotExpert) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // All rows to one expert (ids repeat within a token: still a valid input).
  check_permute(std::vector<int32_t>(16384 * 8, 5), 16384, 8, 0, 8, {16, 64, 128});
  check_permute(std::vector<int32_t>(4096, 1023), 4096, 1, 0, 1024, {1, 64, 128});
  // 90% of the rows to expert 0, the rest spread.
  std::vector<int32_t> skewed = random_ids(4096, 8, 256, rng);
  std::uniform_int_distribution<int> percent(0, 99);
  for (int32_t& id : skewed)
    if (percent(rng) < 90) id = 0;
  check_permute(skewed, 4096, 8, 0, 256, {16, 64, 128});
}

TEST(PermuteGpu, LargeExpandedCount) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  check_permute(random_ids(16384, 8, 256, rng), 16384, 8, 0, 256, {16, 64, 128});
  check_permute(random_ids(16384, 32, 1024, rng), 16384, 32, 0, 1024, {64, 128});
  // 313 chunks: more than the scan keeps in registers (it re-reads the rest).
  check_permute(random_ids(40000, 32, 64, rng), 40000, 32, 0, 64, {128});
}

// A workspace sized for a layer's largest T must serve every smaller call:
// the scratch never shrinks as T grows, across the chunk-size edges (host
// code only; runs without a GPU too).
TEST(PermuteGpu, ScratchNeverShrinksAsTokensGrow) {
  for (int k : {1, 6, 8, 32}) {
    std::size_t previous = 0;
    int drops = 0, first_drop = 0;
    for (int t = 0; t <= 70000; ++t) {
      const std::size_t bytes = permute_scratch_bytes(t, k, 256);
      if (bytes < previous && drops++ == 0) first_drop = t;
      previous = bytes;
    }
    EXPECT_EQ(drops, 0) << "K=" << k << ", first at T=" << first_drop;
  }
}

// `counted` (the routing kernel wrote the counts) is refused where the
// chain has no count kernel to leave out or the octet kernel could not
// have written them; permute_counts names a table only where it could
// (host code only, nothing is launched; runs without a GPU too).
TEST(PermuteGpu, CountedOnlyWhereTheOctetKernelCounts) {
  alignas(8) static int32_t host[16];  // stand-ins: every call below throws before a launch
  const auto params = [&](int t, int k, void* scratch) {
    PermuteParams p;
    p.num_tokens = t;
    p.top_k = k;
    p.num_local = 256;
    p.expert_counts = host;
    p.expert_offsets = host;
    p.scratch = scratch;
    return p;
  };
  EXPECT_EQ(permute_counts(params(100, 8, host)).table, nullptr);  // 800 rows: count and scan in one
  EXPECT_NE(permute_counts(params(4096, 8, host)).table, nullptr);
  EXPECT_EQ(permute_counts(params(4096, 8, reinterpret_cast<char*>(host) + 4)).table, nullptr);
  EXPECT_EQ(permute_counts(params(4096, 8, host)).chunk_rows, 512);
  EXPECT_THROW(launch_permute(params(100, 8, host), chain_plan(800, 256, true), nullptr),
               std::invalid_argument);
  EXPECT_THROW(launch_permute(params(4096, 6, host), chain_plan(4096 * 6, 256, true), nullptr),
               std::invalid_argument);
  EXPECT_THROW(launch_permute(params(4096, 8, reinterpret_cast<char*>(host) + 4),
                              chain_plan(4096 * 8, 256, true), nullptr),
               std::invalid_argument);
}

TEST(PermuteGpu, NoTokensStillWritesCountsOffsetsAndTileCounts) {
  UNIMOE_REQUIRE_GPU();
  check_permute({}, 0, 8, 0, 256, {16, 64, 128});
  check_permute({}, 0, 1, 3, 1, {});
}

// ------------------------------------------------------------ CUDA graph ----

// Three times: T = 333 (the warp routing kernel at K=8 below the octet
// kernel's bound, routing_shape::octets_from_tokens) and two T the octet
// kernel routes, which also writes the permute's chunk counts
// (the plan's routing_counts_rows): the split chain as the layer and the sweep
// launch it.
TEST(PermuteGpu, GraphReplayOfRoutingAndPermute) {
  UNIMOE_REQUIRE_GPU();
  ASSERT_GT(routing_shape::octets_from_tokens(256, 8, true), 333);
  for (const int t : {333, routing_shape::octets_from_tokens(256, 8, true) + 7, 4103}) {
  SCOPED_TRACE("T=" + std::to_string(t));
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const RoutingConfig c = test::grouped_deepseek(256, 8, 8, 4, LogitsType::F32);
  const int local_offset = 32, num_local = 128;
  const std::size_t expanded = static_cast<std::size_t>(t) * c.top_k;

  DeviceBuffer<float> logits(static_cast<std::size_t>(t) * c.num_experts);
  const std::vector<float> bias = test::random_vector(c.num_experts, rng, -0.2f, 0.2f);
  DeviceBuffer<float> d_bias(bias);
  DeviceBuffer<int32_t> ids(expanded);
  DeviceBuffer<float> weights(expanded);
  PermuteBuffers permuted(t, c.top_k, num_local, {16, 64, 128});

  RoutingParams rp;
  rp.logits = logits.get();
  rp.bias = d_bias.get();
  rp.num_tokens = t;
  rp.config = c;
  rp.topk_ids = ids.get();
  rp.topk_weights = weights.get();

  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  const PermuteParams pp = permuted.params(ids.get(), local_offset);
  const RoutingPlan plan = test::routing_plan(c, local_offset, num_local, t, false, "split");
  EXPECT_EQ(plan.routing_counts_rows, t != 333)
      << "UNIMOE_SPLIT_OCTET_COUNT=0 or UNIMOE_SPLIT_OCTETS_MIN_TOKENS set?";
  graph = test::capture(stream, cudaStreamCaptureModeThreadLocal, [&] {
    launch_routing_permute(rp, pp, plan, stream);
  });
  UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    // A different skew each time, so that the routing outcome really changes.
    std::vector<float> values = test::random_vector(logits.size(), rng, -4, 4);
    for (std::size_t i = 0; i < values.size(); ++i)
      if (static_cast<int>(i % c.num_experts) / 32 == replay) values[i] += 2.0f;
    logits.upload(values);
    ids.poison();
    weights.poison();
    permuted.poison();
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());  // uploads and poison land before the replay
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));

    const ref::Routing want = ref::route(c, values.data(), t, bias.data());
    EXPECT_EQ(ids.download(), want.ids);
    const std::vector<float> got_weights = weights.download();
    EXPECT_LT(test::rel_l2(got_weights, want.weights), 1e-6);
    permuted.expect_matches_reference(want.ids, local_offset);
  }
  UNIMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  UNIMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  UNIMOE_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

// The split chain where the octet routing kernel also counts the permute's
// rows (the plan's routing_counts_rows: each block a byte of its chunk's words,
// octet_count_blocks blocks a chunk) and the count kernel is left out:
// ids, weights and every permute output against the reference, scratch
// and outputs poisoned (so the table's unused bytes are garbage). 8, 6, 4
// and 2 blocks a chunk (1024-, 768-, 512- and 256-row chunks), a last chunk
// of one partial block, the filter mode (T=16384, E=256) and the
// exact one, bf16 logits, MiniMax2, an expert-parallel range, a hot
// expert; and calls that keep the count kernel (K=6; K=4 at 768-row
// chunks, 12 blocks a chunk).
TEST(PermuteGpu, OctetRoutingWritesTheChunkCounts) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Case {
    RoutingPolicy policy;
    int e, k, n_group, topk_group, t, local_offset, num_local;
    LogitsType type;
    bool hot;
    int blocks;  // octet_count_blocks; 0: the count kernel stays
  };
  const RoutingPolicy ds = RoutingPolicy::DeepSeekV3;
  const Case cases[] = {
      {ds, 256, 8, 8, 4, 16384, 0, 256, LogitsType::F32, false, 8},        // 1024-row chunks
      {ds, 256, 8, 8, 4, 4096 + 5, 100, 60, LogitsType::F32, true, 4},     // 512
      {ds, 384, 8, 8, 4, 2048, 0, 384, LogitsType::BF16, false, 2},        // 256
      {ds, 384, 8, 8, 2, 2048 + 3, 0, 384, LogitsType::F32, false, 4},     // 512, a partial block
      {ds, 384, 4, 8, 4, 2048 + 11, 64, 256, LogitsType::F32, true, 4},    // 256
      {RoutingPolicy::MiniMax2, 256, 2, 1, 1, 4096 + 1, 0, 256, LogitsType::BF16, false, 8},
      {ds, 128, 8, 1, 1, 8192 + 9, 0, 128, LogitsType::F32, false, 6},     // 768
      {ds, 256, 4, 8, 4, 4200, 0, 256, LogitsType::F32, false, 8},         // 512
      {ds, 256, 6, 8, 4, 4096 + 2, 0, 256, LogitsType::F32, false, 0},     // 96-row blocks
      {ds, 256, 4, 8, 4, 16400, 0, 256, LogitsType::F32, false, 0},        // 768: 12 blocks
  };
  for (const Case& tc : cases) {
    RoutingConfig c = test::grouped_deepseek(tc.e, tc.k, tc.n_group, tc.topk_group, tc.type);
    c.policy = tc.policy;
    const int t = tc.t;
    SCOPED_TRACE("E=" + std::to_string(tc.e) + " K=" + std::to_string(tc.k) + " n_group=" +
                 std::to_string(tc.n_group) + " T=" + std::to_string(t) + " local " +
                 std::to_string(tc.local_offset) + "+" + std::to_string(tc.num_local));
    const std::size_t expanded = static_cast<std::size_t>(t) * tc.k;

    std::vector<float> values = test::random_vector(static_cast<std::size_t>(t) * tc.e, rng, -4, 4);
    if (tc.hot) {
      const int hot = tc.local_offset + static_cast<int>(rng() % static_cast<uint64_t>(tc.num_local));
      for (int i = 0; i < t; ++i) values[static_cast<std::size_t>(i) * tc.e + hot] += 8.0f;
    }
    const test::Logits l = test::make_logits(std::move(values), c);
    DeviceBuffer<float> logits_f32;
    DeviceBuffer<uint16_t> logits_bf16;
    if (tc.type == LogitsType::BF16) {
      logits_bf16 = DeviceBuffer<uint16_t>(l.bf16);
    } else {
      logits_f32 = DeviceBuffer<float>(l.values);
    }
    const std::vector<float> bias = test::random_vector(tc.e, rng, -0.2f, 0.2f);
    DeviceBuffer<float> d_bias(bias);
    DeviceBuffer<int32_t> ids(expanded);
    DeviceBuffer<float> weights(expanded);
    PermuteBuffers permuted(t, tc.k, tc.num_local, {16, 64, 128});

    RoutingParams rp;
    rp.logits = tc.type == LogitsType::BF16 ? static_cast<const void*>(logits_bf16.get())
                                            : static_cast<const void*>(logits_f32.get());
    rp.bias = d_bias.get();
    rp.num_tokens = t;
    rp.config = c;
    rp.topk_ids = ids.get();
    rp.topk_weights = weights.get();
    const PermuteParams pp = permuted.params(ids.get(), tc.local_offset);
    const PermuteCounts counts = permute_counts(pp);
    ASSERT_EQ(routing_shape::octet_count_blocks(tc.k, counts.chunk_rows), tc.blocks);
    const RoutingPlan plan = test::routing_plan(c, tc.local_offset, tc.num_local, t, false, "split");
    ASSERT_EQ(plan.routing_counts_rows, tc.blocks > 0)
        << "UNIMOE_SPLIT_OCTET_COUNT=0 or UNIMOE_SPLIT_OCTETS_MIN_TOKENS set?";

    ids.poison();
    weights.poison();
    permuted.poison();
    launch_routing_permute(rp, pp, plan, nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());

    const ref::Routing want = ref::route(c, l.values.data(), t, bias.data());
    ASSERT_EQ(ids.download(), want.ids);
    EXPECT_LT(test::rel_l2(weights.download(), want.weights), 1e-6);
    permuted.expect_matches_reference(want.ids, tc.local_offset);
  }
}

}  // namespace
}  // namespace unimoe
