// The rig of the fused routing + permute GPU tests: a problem (routing
// config, T, the rank's experts, tile sizes), its host inputs, the device
// buffers that both the fused launch and the split launches (launch_routing
// + launch_permute) write, and the two checks: every output against the CPU
// reference (ids exact, weights within 1e-6 relative, counts, offsets, row
// maps and tiles exact) and the fused outputs against the split ones bit for
// bit. The cluster variant (its plan's kernels) is held to the
// split launches too.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/routing_cases.h"
#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "gpu/routing_plan_util.h"
#include "kernels/routing/fused_routing.cuh"
#include "kernels/permute/permute.cuh"
#include "kernels/routing/routing.cuh"
#include "ref/ref.h"

namespace unimoe::test {

inline RoutingConfig make_routing(RoutingPolicy policy, int e, int k, LogitsType type, bool bias) {
  RoutingConfig c;
  c.policy = policy;
  c.num_experts = e;
  c.top_k = k;
  c.logits_type = type;
  c.has_bias = bias && is_deepseek(policy);
  c.routed_scaling_factor = is_deepseek(policy) ? 2.5f : 1.0f;
  if (policy == RoutingPolicy::DeepSeekV3) {  // grouped where legal
    c.n_group = 8;
    c.topk_group = 4;
    if (!legal_routing(c)) c.n_group = c.topk_group = 1;
  }
  return c;
}

// One call: the routing config, T, the rank's experts and the tile sizes.
struct RoutingProblem {
  RoutingConfig config;
  int num_tokens = 0;
  int local_offset = 0;
  int num_local = 0;  // 0: all E
  std::vector<int> tile_m = {16, 64, 128};

  int local() const { return num_local > 0 ? num_local : config.num_experts; }
  std::string describe() const {
    return to_string(config.policy) + " " + to_string(config.logits_type) +
           " E=" + std::to_string(config.num_experts) + " K=" + std::to_string(config.top_k) +
           " T=" + std::to_string(num_tokens) + " n_group=" + std::to_string(config.n_group) +
           (config.has_bias ? " bias" : "") + " local [" + std::to_string(local_offset) + ", " +
           std::to_string(local_offset + local()) + ")";
  }
};

// Host inputs: logits as the reference sees them (bf16-rounded for BF16)
// with their bf16 bits, the bias; or precomputed ids.
struct RoutingInputs {
  std::vector<float> logits;   // [T, E]
  std::vector<uint16_t> bf16;  // [T, E], BF16 only
  std::vector<float> bias;     // [E] when config.has_bias
  bool precomputed = false;
  std::vector<int32_t> ids;  // [T, K] when precomputed
};

inline RoutingInputs logits_inputs(const RoutingProblem& pr, std::vector<float> values,
                                   std::vector<float> bias) {
  RoutingInputs in;
  in.logits = std::move(values);
  if (pr.config.has_bias) in.bias = std::move(bias);
  if (pr.config.logits_type == LogitsType::BF16) {
    in.bf16.resize(in.logits.size());
    for (std::size_t i = 0; i < in.logits.size(); ++i) {
      in.bf16[i] = ref::f32_to_bf16(in.logits[i]);
      in.logits[i] = ref::bf16_to_f32(in.bf16[i]);
    }
  }
  // DeepSeek keys use a correctly rounded fp32 exp, which glibc's expf is
  // not on a few inputs: those logits move up to the next value (bf16 or
  // fp32), so that host and device keys agree and ids must match exactly.
  if (!is_deepseek(pr.config.policy)) return in;
  for (std::size_t i = 0; i < in.logits.size(); ++i) {
    float& v = in.logits[i];
    while (std::isfinite(v) &&
           std::exp(-v) != static_cast<float>(std::exp(-static_cast<double>(v)))) {
      if (!in.bf16.empty()) {
        v = ref::bf16_to_f32(++in.bf16[i]);
      } else {
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        ++bits;
        std::memcpy(&v, &bits, 4);
      }
    }
  }
  return in;
}

inline RoutingInputs random_inputs(const RoutingProblem& pr, std::mt19937_64& rng,
                                   float spread = 6.0f) {
  const std::size_t n = static_cast<std::size_t>(pr.num_tokens) * pr.config.num_experts;
  return logits_inputs(pr, test::random_vector(n, rng, -spread, spread),
                       test::random_vector(pr.config.num_experts, rng, -0.3f, 0.3f));
}

// K distinct experts per token, uniformly drawn from [0, num_experts).
inline RoutingInputs precomputed_inputs(int num_tokens, int top_k, int num_experts,
                                        std::mt19937_64& rng) {
  RoutingInputs in;
  in.precomputed = true;
  std::vector<int32_t> all(num_experts);
  std::iota(all.begin(), all.end(), 0);
  for (int t = 0; t < num_tokens; ++t) {
    for (int k = 0; k < top_k; ++k) {  // partial Fisher-Yates
      std::uniform_int_distribution<int> pick(k, num_experts - 1);
      std::swap(all[k], all[pick(rng)]);
      in.ids.push_back(all[k]);
    }
  }
  return in;
}

struct RoutingOutputs {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<int32_t> counts, offsets, permuted_to_expanded, expanded_to_permuted, num_tiles;
  std::vector<std::vector<DeviceTile>> tiles;
};

// Device inputs and outputs of one problem; runs the fused or the split launches.
class RoutingRig {
 public:
  RoutingRig(const RoutingProblem& pr, const RoutingInputs& in)
      : pr_(pr), precomputed_(in.precomputed) {
    const std::size_t rows = static_cast<std::size_t>(pr.num_tokens) * pr.config.top_k;
    const std::size_t logits = static_cast<std::size_t>(pr.num_tokens) * pr.config.num_experts;
    // At least one element, so that routing mode never sees a null logits pointer.
    logits_f32_ = DeviceBuffer<float>(std::max<std::size_t>(1, logits));
    logits_bf16_ = DeviceBuffer<uint16_t>(std::max<std::size_t>(1, logits));
    bias_ = DeviceBuffer<float>(pr.config.num_experts);
    given_ids_ = DeviceBuffer<int32_t>(in.ids);
    upload(in);
    ids_ = DeviceBuffer<int32_t>(rows);
    weights_ = DeviceBuffer<float>(rows);
    counts_ = DeviceBuffer<int32_t>(pr.local());
    offsets_ = DeviceBuffer<int32_t>(pr.local() + 1);
    p2e_ = DeviceBuffer<int32_t>(rows);
    e2p_ = DeviceBuffer<int32_t>(rows);
    num_tiles_ = DeviceBuffer<int32_t>(kMaxTileSizes);
    scratch_ =
        DeviceBuffer<uint8_t>(permute_scratch_bytes(pr.num_tokens, pr.config.top_k, pr.local()));
    for (std::size_t s = 0; s < pr.tile_m.size(); ++s)
      tiles_[s] =
          DeviceBuffer<DeviceTile>(max_tiles(static_cast<int>(rows), pr.local(), pr.tile_m[s]));
  }

  void upload(const RoutingInputs& in) {
    if (!in.logits.empty()) {
      if (pr_.config.logits_type == LogitsType::BF16)
        logits_bf16_.upload(in.bf16);
      else
        logits_f32_.upload(in.logits);
    }
    if (!in.bias.empty()) bias_.upload(in.bias);
  }

  void poison() {
    for (auto* b : {&ids_, &counts_, &offsets_, &p2e_, &e2p_, &num_tiles_}) b->poison();
    weights_.poison();
    scratch_.poison();
    for (auto& t : tiles_) t.poison();
  }

  RoutingParams routing() const {
    RoutingParams p;
    p.logits = precomputed_ ? nullptr
               : pr_.config.logits_type == LogitsType::BF16
                   ? static_cast<const void*>(logits_bf16_.get())
                   : static_cast<const void*>(logits_f32_.get());
    p.bias = pr_.config.has_bias ? bias_.get() : nullptr;
    p.num_tokens = pr_.num_tokens;
    p.config = pr_.config;
    p.topk_ids = ids_.get();
    p.topk_weights = weights_.get();
    return p;
  }

  PermuteParams permute() const {
    PermuteParams p;
    p.topk_ids = precomputed_ ? given_ids_.get() : ids_.get();
    p.num_tokens = pr_.num_tokens;
    p.top_k = pr_.config.top_k;
    p.local_offset = pr_.local_offset;
    p.num_local = pr_.local();
    p.expert_counts = counts_.get();
    p.expert_offsets = offsets_.get();
    p.permuted_to_expanded = p2e_.get();
    p.expanded_to_permuted = e2p_.get();
    p.num_tile_sizes = static_cast<int>(pr_.tile_m.size());
    for (std::size_t s = 0; s < pr_.tile_m.size(); ++s) {
      p.tile_m[s] = pr_.tile_m[s];
      p.tiles[s] = tiles_[s].get();
      p.num_tiles[s] = num_tiles_.get() + s;
    }
    p.scratch = scratch_.get();
    return p;
  }

  // The plan a layer would make for this problem with `variant` forced
  // (routing_plan_util.h: the test's development overrides apply).
  RoutingPlan plan(const char* variant) const {
    return routing_plan(pr_.config, pr_.local_offset, pr_.num_local, pr_.num_tokens, precomputed_,
                        variant);
  }
  void run(const char* variant, cudaStream_t stream) const {
    launch_routing_permute(routing(), permute(), plan(variant), stream);
  }
  void run_fused(cudaStream_t stream) const { run("fused", stream); }
  void run_cluster(cudaStream_t stream) const { run("cluster", stream); }
  void run_split(cudaStream_t stream) const { run("split", stream); }

  RoutingOutputs download() const {
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    RoutingOutputs o{
        ids_.download(), weights_.download(), counts_.download(),    offsets_.download(),
        p2e_.download(), e2p_.download(),     num_tiles_.download(), {}};
    for (std::size_t s = 0; s < pr_.tile_m.size(); ++s) o.tiles.push_back(tiles_[s].download());
    return o;
  }

 private:
  RoutingProblem pr_;
  bool precomputed_;
  DeviceBuffer<float> logits_f32_, bias_, weights_;
  DeviceBuffer<uint16_t> logits_bf16_;
  DeviceBuffer<int32_t> given_ids_, ids_, counts_, offsets_, p2e_, e2p_, num_tiles_;
  DeviceBuffer<uint8_t> scratch_;
  DeviceBuffer<DeviceTile> tiles_[kMaxTileSizes];
};

// Every output against the reference for `in`.
inline void expect_matches_reference(const RoutingProblem& pr, const RoutingInputs& in,
                                     const RoutingOutputs& got) {
  std::vector<int32_t> ids = in.ids;
  if (!in.precomputed) {
    const ref::Routing want = ref::route(pr.config, in.logits.data(), pr.num_tokens,
                                         pr.config.has_bias ? in.bias.data() : nullptr);
    int errors = 0;
    std::string first;
    for (std::size_t i = 0; i < want.ids.size(); ++i) {
      if (got.ids[i] == want.ids[i] && weight_matches(got.weights[i], want.weights[i])) continue;
      if (errors++ == 0)
        first = "row " + std::to_string(i) + ": id " + std::to_string(got.ids[i]) + " want " +
                std::to_string(want.ids[i]) + ", weight " + std::to_string(got.weights[i]) +
                " want " + std::to_string(want.weights[i]);
    }
    EXPECT_EQ(errors, 0) << first;
    ids = want.ids;
  }
  const ref::Permutation perm =
      ref::permute(ids.data(), pr.num_tokens, pr.config.top_k, pr.local_offset, pr.local());
  EXPECT_EQ(got.counts, perm.expert_counts);
  EXPECT_EQ(got.offsets, perm.expert_offsets);
  ASSERT_GE(got.permuted_to_expanded.size(), perm.permuted_to_expanded.size());
  const std::vector<int32_t> p2e(
      got.permuted_to_expanded.begin(),
      got.permuted_to_expanded.begin() + perm.permuted_to_expanded.size());
  EXPECT_EQ(p2e, perm.permuted_to_expanded);
  EXPECT_EQ(got.expanded_to_permuted, perm.expanded_to_permuted);
  for (std::size_t s = 0; s < pr.tile_m.size(); ++s) {
    SCOPED_TRACE("tile_m " + std::to_string(pr.tile_m[s]));
    const std::vector<ref::Tile> want = ref::make_tiles(perm, pr.tile_m[s]);
    ASSERT_EQ(got.num_tiles[s], static_cast<int32_t>(want.size()));
    int errors = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const DeviceTile& g = got.tiles[s][i];
      errors += g.expert != want[i].expert || g.row_start != want[i].row_start ||
                g.rows != want[i].rows || g.pad != 0;
    }
    EXPECT_EQ(errors, 0);
  }
}

inline std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

// The fused outputs equal the split launches' bit for bit, where defined.
inline void expect_identical(const RoutingOutputs& fused, const RoutingOutputs& split,
                             bool precomputed) {
  if (!precomputed) {
    EXPECT_EQ(fused.ids, split.ids);
    EXPECT_EQ(bits_of(fused.weights), bits_of(split.weights));
  }
  EXPECT_EQ(fused.counts, split.counts);
  EXPECT_EQ(fused.offsets, split.offsets);
  EXPECT_EQ(fused.expanded_to_permuted, split.expanded_to_permuted);
  const std::size_t placed = std::max(0, split.offsets.back());
  ASSERT_LE(placed, split.permuted_to_expanded.size());
  EXPECT_TRUE(std::equal(fused.permuted_to_expanded.begin(),
                         fused.permuted_to_expanded.begin() + placed,
                         split.permuted_to_expanded.begin()));
  EXPECT_EQ(fused.num_tiles, split.num_tiles);
  for (std::size_t s = 0; s < split.tiles.size(); ++s) {
    const std::size_t n = std::max(0, split.num_tiles[s]);
    ASSERT_LE(n, split.tiles[s].size());
    EXPECT_EQ(0, std::memcmp(fused.tiles[s].data(), split.tiles[s].data(), n * sizeof(DeviceTile)))
        << "tile schedule " << s;
  }
}

// Fused, cluster, then split, each on poisoned outputs; the fused result
// against the reference, the fused and cluster results against split.
inline void check_fused_and_split(const RoutingProblem& pr, const RoutingInputs& in) {
  SCOPED_TRACE(pr.describe() + (in.precomputed ? " precomputed" : ""));
  RoutingRig rig(pr, in);
  rig.poison();
  rig.run_fused(nullptr);
  const RoutingOutputs fused = rig.download();
  expect_matches_reference(pr, in, fused);
  rig.poison();
  rig.run_cluster(nullptr);
  const RoutingOutputs cluster = rig.download();
  rig.poison();
  rig.run_split(nullptr);
  const RoutingOutputs split = rig.download();
  {
    SCOPED_TRACE("fused against split");
    expect_identical(fused, split, in.precomputed);
  }
  {
    SCOPED_TRACE("cluster against split");
    expect_identical(cluster, split, in.precomputed);
  }
}

}  // namespace unimoe::test
