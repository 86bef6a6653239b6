// The BF16 experts stages on the device (GEMM1 with gather and activation,
// GEMM2, finalize) against simple host loops stage by stage, and end to end
// against ref::moe_forward.
//
// Metrics. Each device stage rounds an fp32 result once to bf16, so against
// an fp64 host loop over the same bf16 inputs an element may be off by half a
// bf16 step (2^-9 relative) plus fp32 accumulation error far below that:
// element-wise |got - want| <= 2^-8 |want| + 1e-4 rms(want). End to end the
// device also rounds the intermediate y and the output to bf16 (the reference
// keeps both in fp64), so the bound there is relative L2 error < 1e-2.
// Outputs are poisoned (0xff, a NaN in bf16) before each run: a value not
// written shows up as NaN, and rows past the permuted rows must stay poisoned.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/experts_harness.h"
#include "gpu/gpu_test_util.h"
#include "kernels/gemm/grouped_gemm.cuh"
#include "ref/ref.h"

namespace unimoe {
namespace {

using test::Case;
using test::DeviceExperts;
using test::Problem;
using test::to_float;

double dot(const float* a, const float* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

int expert_of_row(const ref::Permutation& perm, int r) {
  const auto& offsets = perm.expert_offsets;
  return static_cast<int>(std::upper_bound(offsets.begin(), offsets.end(), r) - offsets.begin()) - 1;
}

// a[r, j] by the contract: gathered x row, fp64 dot products, bias, activation.
std::vector<double> host_gemm1(const Problem& p, const ref::Permutation& perm) {
  const Case& c = p.c;
  const int rows = perm.expert_offsets.back(), cols = c.gemm1_cols();
  std::vector<double> a(static_cast<size_t>(rows) * c.intermediate);
  for (int r = 0; r < rows; ++r) {
    const int e = expert_of_row(perm, r);
    const int token = perm.permuted_to_expanded[r] / c.top_k;
    const float* xr = p.x.data() + static_cast<size_t>(token) * c.hidden;
    const float* w = p.w13.data() + static_cast<size_t>(e) * cols * c.hidden;
    for (int j = 0; j < c.intermediate; ++j) {
      double g = dot(w + static_cast<size_t>(j) * c.hidden, xr, c.hidden), u = 0;
      if (c.bias) g += p.b13[static_cast<size_t>(e) * cols + j];
      if (c.gated()) {
        u = dot(w + static_cast<size_t>(c.intermediate + j) * c.hidden, xr, c.hidden);
        if (c.bias) u += p.b13[static_cast<size_t>(e) * cols + c.intermediate + j];
      }
      a[static_cast<size_t>(r) * c.intermediate + j] =
          ref::activate(c.activation, g, u, 1.702, 7.0);
    }
  }
  return a;
}

// y[r, h] from the device's own a, so that this checks GEMM2 alone.
std::vector<double> host_gemm2(const Problem& p, const ref::Permutation& perm,
                               const std::vector<float>& act) {
  const Case& c = p.c;
  const int rows = perm.expert_offsets.back();
  std::vector<double> y(static_cast<size_t>(rows) * c.hidden);
  for (int r = 0; r < rows; ++r) {
    const int e = expert_of_row(perm, r);
    for (int h = 0; h < c.hidden; ++h)
      y[static_cast<size_t>(r) * c.hidden + h] =
          dot(p.w2.data() + (static_cast<size_t>(e) * c.hidden + h) * c.intermediate,
              act.data() + static_cast<size_t>(r) * c.intermediate, c.intermediate) +
          (c.bias ? p.b2[static_cast<size_t>(e) * c.hidden + h] : 0.0);
  }
  return y;
}

// out[t] from the device's own y, so that this checks finalize alone.
std::vector<double> host_finalize(const Problem& p, const ref::Permutation& perm,
                                  const std::vector<float>& y) {
  const Case& c = p.c;
  std::vector<double> out(static_cast<size_t>(c.tokens) * c.hidden, 0.0);
  for (int t = 0; t < c.tokens; ++t)
    for (int k = 0; k < c.top_k; ++k) {
      const int r = perm.expanded_to_permuted[static_cast<size_t>(t) * c.top_k + k];
      if (r < 0) continue;
      const double w = p.routing.weights[static_cast<size_t>(t) * c.top_k + k];
      for (int h = 0; h < c.hidden; ++h)
        out[static_cast<size_t>(t) * c.hidden + h] += w * y[static_cast<size_t>(r) * c.hidden + h];
    }
  return out;
}

// The element-wise bf16 bound of the header comment, over the first want.size() values.
void expect_bf16_close(const std::vector<float>& got, const std::vector<double>& want,
                       const std::string& what) {
  double sq = 0;
  for (double w : want) sq += w * w;
  const double floor = want.empty() ? 0 : 1e-4 * std::sqrt(sq / want.size());
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= std::ldexp(std::fabs(want[i]), -8) + floor) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: device " << got[i] << ", host " << want[i];
  }
  EXPECT_EQ(bad, 0) << what << ": elements outside the bound";
}

// Bits of rows [from, capacity) must still be the poison.
void expect_untouched(const std::vector<uint16_t>& bits, size_t from, const std::string& what) {
  const size_t touched = std::count_if(bits.begin() + std::min(from, bits.size()), bits.end(),
                                       [](uint16_t b) { return b != 0xffff; });
  EXPECT_EQ(touched, 0u) << what << ": values written past the permuted rows";
}

ref::WeightSource weight_source(const Problem& p) {
  return [&p](int e) {
    const Case& c = p.c;
    ref::ExpertView v;
    v.w13 = p.w13.data() + static_cast<size_t>(e) * c.gemm1_cols() * c.hidden;
    v.w2 = p.w2.data() + static_cast<size_t>(e) * c.hidden * c.intermediate;
    if (c.bias) {
      v.b13 = p.b13.data() + static_cast<size_t>(e) * c.gemm1_cols();
      v.b2 = p.b2.data() + static_cast<size_t>(e) * c.hidden;
    }
    return v;
  };
}

MoEConfig moe_config(const Case& c) {
  MoEConfig m;
  m.routing.num_experts = c.experts;
  m.routing.top_k = c.top_k;
  m.experts.hidden = c.hidden;
  m.experts.intermediate = c.intermediate;
  m.experts.activation = c.activation;
  m.experts.has_bias = c.bias;
  m.experts.local_expert_offset = c.local_offset;
  m.experts.num_local_experts = c.num_local;
  return m;
}

// Every stage of one run against its host loop, and the output against the reference.
void check_run(const Problem& p, const DeviceExperts& dev, const ref::Permutation& perm) {
  const Case& c = p.c;
  const size_t rows = perm.expert_offsets.back();
  const std::vector<uint16_t> act_bits = dev.act(), y_bits = dev.y(), out_bits = dev.out();
  const std::vector<float> act = to_float(act_bits), y = to_float(y_bits), out = to_float(out_bits);

  expect_bf16_close(act, host_gemm1(p, perm), "a");
  expect_untouched(act_bits, rows * c.intermediate, "a");
  expect_bf16_close(y, host_gemm2(p, perm, act), "y");
  expect_untouched(y_bits, rows * c.hidden, "y");
  expect_bf16_close(out, host_finalize(p, perm, y), "out");

  const std::vector<float> want =
      ref::moe_forward(moe_config(c), weight_source(p), p.x.data(), p.routing);
  const double err = test::rel_l2(out, want);
  EXPECT_LT(err, 1e-2) << "out against ref::moe_forward";

  // A token with no on-rank row gets exact zeros, not poison or leftovers.
  for (int t = 0; t < c.tokens; ++t) {
    bool on_rank = false;
    for (int k = 0; k < c.top_k; ++k) on_rank |= perm.expanded_to_permuted[t * c.top_k + k] >= 0;
    if (on_rank) continue;
    for (int h = 0; h < c.hidden; ++h)
      if (out_bits[static_cast<size_t>(t) * c.hidden + h] != 0) {
        ADD_FAILURE() << "token " << t << " has no on-rank expert but out[" << h
                      << "] = " << out[static_cast<size_t>(t) * c.hidden + h];
        break;
      }
  }
}

void run_case(const Case& c, const GemmTactic& t1, const GemmTactic& t2) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(c.label() + " gemm1 " + t1.to_string() + " gemm2 " + t2.to_string() + " seed " +
               std::to_string(seed));
  const Problem p = make_problem(c, seed);
  DeviceExperts dev(p, t1, t2);
  const ref::Permutation perm = dev.set_routing(p.routing);
  dev.launch(nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  check_run(p, dev, perm);
}

std::vector<GemmTactic> all_tactics() {
  int n = 0;
  const GemmTactic* t = gemm_tactics(&n);
  return std::vector<GemmTactic>(t, t + n);
}

TEST(GroupedGemm, TacticsPrintAndUnknownOnesAreRefused) {
  UNIMOE_REQUIRE_GPU();
  const std::vector<GemmTactic> tactics = all_tactics();
  ASSERT_FALSE(tactics.empty());
  EXPECT_EQ(tactics.front().to_string(), "m" + std::to_string(tactics.front().tile_m) + "n" +
                                              std::to_string(tactics.front().tile_n));
  for (size_t i = 0; i < tactics.size(); ++i)
    for (size_t j = 0; j < i; ++j) EXPECT_NE(tactics[i].to_string(), tactics[j].to_string());
  Gemm2Params g2;
  g2.hidden = g2.intermediate = 64;
  g2.max_tiles = 1;
  try {
    launch_gemm2(g2, GemmTactic{24, 40}, nullptr);
    ADD_FAILURE() << "an uncompiled tactic was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not compiled"), std::string::npos) << e.what();
  }
}

// K tails (H = 200, I = 168 are not multiples of 64) and partial column blocks everywhere.
TEST(GroupedGemm, EveryTacticAndTokenCountMatchesTheReference) {
  UNIMOE_REQUIRE_GPU();
  for (const GemmTactic& t : all_tactics())
    for (int tokens : {1, 3, 33, 100}) {
      Case c;
      c.tokens = tokens;
      c.hidden = 200;
      c.intermediate = 168;
      c.experts = 8;
      c.top_k = 4;
      run_case(c, t, t);
    }
}

// The stream kernel's one-token path (tiles of one row) keeps 1, 2, 4 or 8
// K pieces of 256 in flight by K (< 512, < 1024, < 2048, >= 2048); these
// sizes reach every count with a partial last round and a partial last
// piece, in both GEMMs, next to tiles of 2-3 rows that take the other path.
TEST(GroupedGemm, StreamOneTokenTilesAtEveryKSplit) {
  UNIMOE_REQUIRE_GPU();
  const GemmTactic stream = all_tactics().back();
  ASSERT_TRUE(stream.stream);
  // GEMM1's K splits (stream_k_splits, 132 SMs): {2056, 264} keeps 8 (half
  // a wave), {2056, 1032} takes 4 (1.95 waves at T=1), {1160, 264} 4 by K,
  // {520, 776} 2; GEMM2's: 4, 1, 2 and 1.
  const int sizes[][2] = {{2056, 1032}, {2056, 264}, {520, 776}, {1160, 264}};
  for (const auto& hi : sizes)
    for (int tokens : {1, 3}) {
      Case c;
      c.tokens = tokens;
      c.hidden = hi[0];
      c.intermediate = hi[1];
      c.experts = 16;
      c.top_k = 4;
      run_case(c, stream, stream);
    }
  // Biases and the clamped activation on one-row tiles (every tile at T=1).
  Case b;
  b.tokens = 1;
  b.hidden = 1032;
  b.intermediate = 520;
  b.experts = 16;
  b.top_k = 4;
  b.activation = Activation::SwiGLUOai;
  b.bias = true;
  b.bias_scale = 8.0f;
  run_case(b, stream, stream);
}

TEST(GroupedGemm, OddSizesEveryActivation) {
  UNIMOE_REQUIRE_GPU();
  for (const GemmTactic& t : all_tactics())
    for (Activation act : {Activation::SwiGLU, Activation::GeGLU, Activation::ReLU2,
                           Activation::SwiGLUOai}) {
      Case c;
      c.tokens = 33;
      c.hidden = 72;
      c.intermediate = 40;
      c.experts = 4;
      c.top_k = 2;
      c.activation = act;
      c.bias = act == Activation::SwiGLUOai;
      run_case(c, t, t);
    }
}

// Biases of +-8 push pre-activations past the clamp limit (7) on both sides.
TEST(GroupedGemm, BiasesWithClampedAndPointwiseActivations) {
  UNIMOE_REQUIRE_GPU();
  for (const GemmTactic& t : all_tactics())
    for (Activation act : {Activation::SwiGLUOai, Activation::ReLU2, Activation::SwiGLU}) {
      Case c;
      c.tokens = 100;
      c.hidden = 128;
      c.intermediate = 96;
      c.experts = 16;
      c.top_k = 4;
      c.activation = act;
      c.bias = true;
      c.bias_scale = 8.0f;
      run_case(c, t, t);
    }
}

TEST(GroupedGemm, EmptyExpertsAndOneHotExpert) {
  UNIMOE_REQUIRE_GPU();
  for (const GemmTactic& t : all_tactics()) {
    Case few;  // 13 of 16 experts get no row
    few.tokens = 33;
    few.hidden = 96;
    few.intermediate = 64;
    few.experts = 16;
    few.top_k = 2;
    few.allowed = {2, 9, 13};
    run_case(few, t, t);

    Case hot = few;  // every token on expert 5: one expert spans many tiles
    hot.tokens = 100;
    hot.allowed.clear();
    hot.hot = 5;
    run_case(hot, t, t);
  }
}

TEST(GroupedGemm, ExpertParallelRangeLeavesOffRankTokensZero) {
  UNIMOE_REQUIRE_GPU();
  for (const GemmTactic& t : all_tactics()) {
    Case c;
    c.tokens = 100;
    c.hidden = 136;
    c.intermediate = 88;
    c.experts = 16;
    c.top_k = 2;
    c.local_offset = 4;
    c.num_local = 5;
    run_case(c, t, t);
  }
}

// The schedules of GEMM1 and GEMM2 are independent: different M tiles per stage.
TEST(GroupedGemm, DifferentTacticsPerStage) {
  UNIMOE_REQUIRE_GPU();
  const std::vector<GemmTactic> tactics = all_tactics();
  Case c;
  c.tokens = 64;
  c.hidden = 512;
  c.intermediate = 256;
  c.experts = 8;
  c.top_k = 8;
  run_case(c, tactics.back(), tactics.front());
  run_case(c, tactics.front(), tactics.back());
}

std::vector<GemmTactic> wgmma_tactics() {
  std::vector<GemmTactic> out;
  for (const GemmTactic& t : all_tactics())
    if (t.wgmma) out.push_back(t);
  return out;
}

// The wgmma tactics at prefill-like sizes: many 128-row tiles, K of many
// 64-wide blocks (deeper than the pipeline) with a tail, column blocks with
// a partial last one for both GEMMs, and an expert hot enough for several
// tiles.
TEST(GroupedGemm, WgmmaTacticsAtPrefillSizes) {
  UNIMOE_REQUIRE_GPU();
  const std::vector<GemmTactic> wg = wgmma_tactics();
  ASSERT_FALSE(wg.empty());
  for (const GemmTactic& t : wg) {
    Case c;
    c.tokens = 700;
    c.hidden = 1096;
    c.intermediate = 520;
    c.experts = 8;
    c.top_k = 2;
    run_case(c, t, t);
    Case hot = c;
    hot.tokens = 300;
    hot.hot = 6;
    hot.activation = Activation::SwiGLUOai;
    hot.bias = true;
    run_case(hot, t, t);
  }
  // Each wgmma tactic beside the mma.sync one of the same tile rows.
  Case mixed;
  mixed.tokens = 260;
  mixed.hidden = 384;
  mixed.intermediate = 192;
  mixed.experts = 4;
  mixed.top_k = 2;
  run_case(mixed, wg.front(), GemmTactic{128, 128});
  run_case(mixed, GemmTactic{128, 128}, wg.back());
}

// One capture serves any routing: the grid comes from the capacity, the work
// from the device tile count.
void graph_replay_follows_the_routing(const GemmTactic& t) {
  SCOPED_TRACE(t.to_string());
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Case c;
  c.tokens = 48;
  c.hidden = 256;
  c.intermediate = 128;
  c.experts = 16;
  c.top_k = 4;
  Problem p = make_problem(c, seed);
  DeviceExperts dev(p, t, t);
  dev.set_routing(p.routing);

  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  graph = test::capture(stream, cudaStreamCaptureModeGlobal, [&] {
    dev.launch(stream);
  });
  UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  std::mt19937_64 rng(seed + 1);
  Case skewed = c;  // a second routing with a different tile count
  skewed.hot = 3;
  for (const ref::Routing& routing : {p.routing, make_routing(skewed, rng)}) {
    p.routing = routing;
    const ref::Permutation perm = dev.set_routing(routing);
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    check_run(p, dev, perm);
  }
  UNIMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  UNIMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  UNIMOE_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(GroupedGemm, GraphReplayFollowsTheRouting) {
  UNIMOE_REQUIRE_GPU();
  graph_replay_follows_the_routing(all_tactics().front());
  for (const GemmTactic& t : wgmma_tactics()) graph_replay_follows_the_routing(t);
}

}  // namespace
}  // namespace unimoe
