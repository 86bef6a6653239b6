// Choice floor probe (development only; built by hand, not by CMake): how
// many cycles one warp takes to choose a token's experts, as a routing CTA
// of the cluster kernel chooses them. Two shapes:
//   - DeepSeekV3 E=256, 8 groups of 32, 4 kept, K=8 (four forms over the
//     same rows): library, choose_decode with r.fixed_choice 0 (the group
//     stage and rounds_by_threshold) from keys the block staged; fixed, the
//     same call with r.fixed_choice 1 (src/kernels/routing/routing_fixed.cuh);
//     lib-direct and fixed-direct, both from the logits, each warp
//     computing its token's keys (the cluster kernel's direct-keys twin);
//   - Renormalize E=128 (4 strided slots), K = 4, 6, 8: choose_decode of
//     the rounds' kernels against that of the threshold kernels
//     (rounds_by_ranked_threshold where threshold_serves, K >= 6; the
//     rounds at K = 4).
// Each block's W warps choose a token each, twice (the second pass finds
// its code in the SM's caches and the logits in L1); lane 0 reads clock64
// around each pass. The probe prints the median of each pass and the 90th
// percentile of the second over the warps, for several W, and checks that
// the forms' ids agree (in order) on every token: random rows, rows of few
// values (every DeepSeek row of the tied set; every 4th Renormalize row),
// whose candidates often pass 32 (the rounds).
//
// Build (from the repository root) and run on a GPU:
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -Isrc -Iinclude \
//     bench/probes/choice_floor.cu -o /tmp/choice_floor && /tmp/choice_floor [blocks]
// Its H200 figures are quoted where the library cites them
// (core/routing_shape_choice.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/routing/fused_routing_kernels.cuh"
#include "probe_check.h"

using namespace unimoe;
using namespace unimoe::routing_detail;
using namespace unimoe::fused_detail;

constexpr int kE = 256, kK = 8, kGroups = 8, kKept = 4, kPerLane = kE / 32;
constexpr int kMaxWarps = 10;

// Forms: the library's choice (r.fixed_choice 0) or the fixed choice (1),
// from keys the block staged or, kDirect, from the logits (the cluster
// kernel's direct-keys twin).
constexpr int kForms = 4;
const char* const kFormNames[kForms] = {"library", "fixed", "lib-direct", "fixed-direct"};

// One block: W = blockDim.x / 32 tokens from blockIdx.x * W; cycles[(token
// * 2 + pass)], ids[token * K + k].
template <bool kDirect>
__global__ void __launch_bounds__(1024, 1)
    choice_kernel(const __grid_constant__ RoutingKernelParams r, long long* cycles, int* ids) {
  __shared__ BlockShared s;
  __shared__ int chosen[kMaxWarps][kK];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int begin = blockIdx.x * warps;
  if ((touch_params(r) ^ 0x9e3779b9u) == 0u) s.scan[kWarpSize] = 0;  // warm the parameters
  const int token = begin + warp;
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    if (!kDirect) stage_deepseek_keys<float>(r, begin, begin + warps, s.work.keys);
    __syncthreads();
    float* keys = s.work.keys + warp * kE;  // the token's staged row, or the warp's area
    const long long t0 = clock64();
    const int expert = choose_decode<float, kPerLane, true, true, kDirect>(r, token, lane, keys).expert;
    if (lane < kK) chosen[warp][lane] = expert;
    __syncwarp();
    const long long t1 = clock64();
    if (lane == 0) cycles[token * 2 + pass] = t1 - t0;
    if (lane < kK) ids[token * kK + lane] = chosen[warp][lane];
    __syncthreads();  // the next pass stages the keys again
  }
}

// The policies without groups at E=128 (4 strided slots a lane): the
// rounds' kernels' choice (kFast false) or the threshold kernels'
// (rounds_by_ranked_threshold), from the logits, each warp's group keys
// area as in the cluster kernel.
template <bool kFast>
__global__ void __launch_bounds__(1024, 1)
    topk_kernel(const __grid_constant__ RoutingKernelParams r, long long* cycles, int* ids) {
  __shared__ BlockShared s;
  __shared__ int chosen[kMaxWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if ((touch_params(r) ^ 0x9e3779b9u) == 0u) s.scan[kWarpSize] = 0;  // warm the parameters
  const int token = blockIdx.x * warps + warp;
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    __syncthreads();
    float* keys = s.work.keys + warp * 4 * kWarpSize;
    const long long t0 = clock64();
    const int expert = choose_decode<float, 4, false, kFast>(r, token, lane, keys).expert;
    if (lane < r.top_k) chosen[warp][lane] = expert;
    __syncwarp();
    const long long t1 = clock64();
    if (lane == 0) cycles[token * 2 + pass] = t1 - t0;
    if (lane < r.top_k) ids[token * r.top_k + lane] = chosen[warp][lane];
  }
}


static long long percentile(std::vector<long long> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

// Device buffers of one row set: logits (and a bias), cycles and ids.
struct Rows {
  float* logits = nullptr;
  float* bias = nullptr;
  long long* cycles = nullptr;
  int* ids = nullptr;
  int tokens = 0, top_k = 0;

  Rows(const std::vector<float>& h_logits, const std::vector<float>& h_bias, int t, int k)
      : tokens(t), top_k(k) {
    CHECK(cudaMalloc(&logits, h_logits.size() * sizeof(float)));
    CHECK(cudaMemcpy(logits, h_logits.data(), h_logits.size() * sizeof(float),
                     cudaMemcpyHostToDevice));
    if (!h_bias.empty()) {
      CHECK(cudaMalloc(&bias, h_bias.size() * sizeof(float)));
      CHECK(cudaMemcpy(bias, h_bias.data(), h_bias.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    CHECK(cudaMalloc(&cycles, tokens * 2 * sizeof(long long)));
    CHECK(cudaMalloc(&ids, tokens * top_k * sizeof(int)));
  }
  ~Rows() {
    cudaFree(logits);
    cudaFree(bias);
    cudaFree(cycles);
    cudaFree(ids);
  }
  Rows(const Rows&) = delete;
  Rows& operator=(const Rows&) = delete;
};

// Launches a form three times (the first loads the module), prints the
// median of each pass and the 90th percentile of the second, and returns
// the last launch's ids.
template <class Launch>
std::vector<int> time_form(const Rows& rows, const char* name, Launch launch) {
  for (int rep = 0; rep < 3; ++rep) {
    CHECK(cudaMemset(rows.ids, 0xff, rows.tokens * rows.top_k * sizeof(int)));
    launch();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
  }
  std::vector<long long> cyc(rows.tokens * 2);
  std::vector<int> ids(rows.tokens * rows.top_k);
  CHECK(cudaMemcpy(cyc.data(), rows.cycles, cyc.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(ids.data(), rows.ids, ids.size() * sizeof(int), cudaMemcpyDeviceToHost));
  std::vector<long long> pass[2];
  for (int t = 0; t < rows.tokens; ++t)
    for (int q = 0; q < 2; ++q) pass[q].push_back(cyc[t * 2 + q]);
  std::printf("  %s %5lld/%5lld (p90 %5lld)", name, percentile(pass[0], 0.5),
              percentile(pass[1], 0.5), percentile(pass[1], 0.9));
  return ids;
}

// Ids that differ from the first form's, printed and returned.
static int count_mismatches(const std::vector<std::vector<int>>& ids) {
  int mismatches = 0;
  for (size_t f = 1; f < ids.size(); ++f)
    for (size_t i = 0; i < ids[0].size(); ++i) mismatches += ids[0][i] != ids[f][i];
  std::printf("  mismatches %d\n", mismatches);
  return mismatches;
}

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? std::atoi(argv[1]) : 64;
  int failures = 0;
  for (int tied = 0; tied < 2; ++tied) {
    for (int warps : {1, 2, 4, 5, 8}) {  // at most kMaxWarps
      const int tokens = blocks * warps;
      std::mt19937 rng(1234 + warps + 100 * tied);
      std::uniform_real_distribution<float> logit(-4.0f, 4.0f), bias(-0.01f, 0.01f);
      std::vector<float> h_logits(static_cast<size_t>(tokens) * kE), h_bias(kE);
      // Tied rows: logits from 6 values and no bias spread, so that groups
      // and keys tie (the lists pass 32 and the fallback runs).
      for (auto& v : h_logits) v = tied ? static_cast<float>(static_cast<int>(rng() % 6)) : logit(rng);
      for (auto& v : h_bias) v = tied ? 0.0f : bias(rng);
      const Rows rows(h_logits, h_bias, tokens, kK);
      RoutingParams rp;
      rp.logits = rows.logits;
      rp.bias = rows.bias;
      rp.num_tokens = tokens;
      rp.config.num_experts = kE;
      rp.config.top_k = kK;
      rp.config.policy = RoutingPolicy::DeepSeekV3;
      rp.config.n_group = kGroups;
      rp.config.topk_group = kKept;
      rp.config.has_bias = true;
      rp.config.routed_scaling_factor = 2.5f;
      check_routing_config(rp, "probe");
      RoutingKernelParams r = make_routing_kernel_params(rp);
      std::vector<std::vector<int>> ids;
      std::printf("%s W=%d:", tied ? "tied  " : "random", warps);
      for (int f = 0; f < kForms; ++f) {
        r.fixed_choice = f % 2;
        ids.push_back(time_form(rows, kFormNames[f], [&] {
          if (f < 2) choice_kernel<false><<<blocks, warps * 32>>>(r, rows.cycles, rows.ids);
          if (f >= 2) choice_kernel<true><<<blocks, warps * 32>>>(r, rows.cycles, rows.ids);
        }));
      }
      failures += count_mismatches(ids);
    }
  }
  // Renormalize E=128: the rounds against the threshold kernels' choice
  // (rounds_by_ranked_threshold).
  for (int k : {4, 6, 8})
    for (int warps : {1, 4, 8, 10}) {
      const int tokens = blocks * warps, e = 128;
      std::mt19937 rng(99 + warps + 10 * k);
      std::uniform_real_distribution<float> logit(-4.0f, 4.0f);
      std::vector<float> h_logits(static_cast<size_t>(tokens) * e);
      for (size_t i = 0; i < h_logits.size(); ++i)  // every 4th token tied: 3 values
        h_logits[i] = (i / e) % 4 == 3 ? static_cast<float>(rng() % 3) : logit(rng);
      const Rows rows(h_logits, {}, tokens, k);
      RoutingParams rp;
      rp.logits = rows.logits;
      rp.num_tokens = tokens;
      rp.config.num_experts = e;
      rp.config.top_k = k;
      rp.config.policy = RoutingPolicy::Renormalize;
      check_routing_config(rp, "probe");
      const RoutingKernelParams r = make_routing_kernel_params(rp);
      std::vector<std::vector<int>> ids;
      std::printf("Renormalize E=128 K=%d W=%2d:", k, warps);
      ids.push_back(time_form(rows, "rounds", [&] {
        topk_kernel<false><<<blocks, warps * 32>>>(r, rows.cycles, rows.ids);
      }));
      ids.push_back(time_form(rows, "ranked", [&] {
        topk_kernel<true><<<blocks, warps * 32>>>(r, rows.cycles, rows.ids);
      }));
      failures += count_mismatches(ids);
    }
  std::printf("%s\n", failures == 0 ? "ids agree" : "IDS DIFFER");
  return failures == 0 ? 0 : 1;
}
