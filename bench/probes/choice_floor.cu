// Choice floor probe (development only; built by hand, not by CMake): how
// many cycles one warp takes to choose a DeepSeekV3 token's experts (E=256,
// 8 groups of 32, 4 kept, K=8) from its keys staged in shared memory, as a
// routing CTA of the cluster kernel chooses them. Forms over the same keys:
//   - library: choose_decode (src/kernels/fused_routing_kernels.cuh) as the
//     cluster kernel's threshold kernels call it (staged keys, runs, the
//     group stage, rounds_by_threshold);
//   - fixed: the fixed choice (src/kernels/routing_fixed.cuh) through the
//     same call, r.fixed_choice set;
//   - lib-direct, fixed-direct: both from the logits, each warp computing
//     its token's keys (the cluster kernel's direct-keys twin).
// Each block stages the keys of its W tokens (a key a thread), then every
// warp chooses its token twice (the second pass finds its code in the SM's
// caches); lane 0 reads clock64 around each pass. The probe prints the
// median and the 90th percentile over the warps of each pass, for W = 1, 2,
// 4, 5 and 8 choosing warps a block, and checks that the forms' ids agree
// (in order) on every token, random and tied keys.
//
// Build (from the repository root) and run on a GPU:
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -Isrc -Iinclude \
//     bench/probes/choice_floor.cu -o /tmp/choice_floor && /tmp/choice_floor
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/fused_routing_kernels.cuh"

using namespace unimoe;
using namespace unimoe::routing_detail;
using namespace unimoe::fused_detail;

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t err_ = (x);                                                              \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

constexpr int kE = 256, kK = 8, kGroups = 8, kKept = 4, kPerLane = kE / 32;
constexpr int kMaxWarps = 8;

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

static long long percentile(std::vector<long long> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? std::atoi(argv[1]) : 64;
  int failures = 0;
  for (int tied = 0; tied < 2; ++tied) {
    for (int warps : {1, 2, 4, 5, 8}) {
      const int tokens = blocks * warps;
      std::mt19937 rng(1234 + warps + 100 * tied);
      std::uniform_real_distribution<float> logit(-4.0f, 4.0f), bias(-0.01f, 0.01f);
      std::vector<float> h_logits(static_cast<size_t>(tokens) * kE), h_bias(kE);
      // Tied rows: logits from 6 values and no bias spread, so that groups
      // and keys tie (the lists pass 32 and the fallback runs).
      for (auto& v : h_logits) v = tied ? static_cast<float>(static_cast<int>(rng() % 6)) : logit(rng);
      for (auto& v : h_bias) v = tied ? 0.0f : bias(rng);
      float *d_logits, *d_bias;
      long long* d_cycles;
      int* d_ids;
      CHECK(cudaMalloc(&d_logits, h_logits.size() * sizeof(float)));
      CHECK(cudaMalloc(&d_bias, kE * sizeof(float)));
      CHECK(cudaMalloc(&d_cycles, tokens * 2 * sizeof(long long)));
      CHECK(cudaMalloc(&d_ids, tokens * kK * sizeof(int)));
      CHECK(cudaMemcpy(d_logits, h_logits.data(), h_logits.size() * sizeof(float),
                       cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(d_bias, h_bias.data(), kE * sizeof(float), cudaMemcpyHostToDevice));
      RoutingParams rp;
      rp.logits = d_logits;
      rp.bias = d_bias;
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
      std::vector<int> ids[kForms];
      std::printf("%s W=%d:", tied ? "tied  " : "random", warps);
      for (int f = 0; f < kForms; ++f) {
        std::vector<long long> cyc(tokens * 2);
        ids[f].resize(tokens * kK);
        for (int rep = 0; rep < 3; ++rep) {  // the first launch loads the module
          CHECK(cudaMemset(d_ids, 0xff, tokens * kK * sizeof(int)));
          r.fixed_choice = f % 2;
          if (f < 2) choice_kernel<false><<<blocks, warps * 32>>>(r, d_cycles, d_ids);
          if (f >= 2) choice_kernel<true><<<blocks, warps * 32>>>(r, d_cycles, d_ids);
          CHECK(cudaGetLastError());
          CHECK(cudaDeviceSynchronize());
        }
        CHECK(cudaMemcpy(cyc.data(), d_cycles, cyc.size() * sizeof(long long), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(ids[f].data(), d_ids, ids[f].size() * sizeof(int), cudaMemcpyDeviceToHost));
        std::vector<long long> pass[2];
        for (int t = 0; t < tokens; ++t)
          for (int q = 0; q < 2; ++q) pass[q].push_back(cyc[t * 2 + q]);
        std::printf("  %s %5lld/%5lld (p90 %5lld)", kFormNames[f],
                    percentile(pass[0], 0.5), percentile(pass[1], 0.5), percentile(pass[1], 0.9));
      }
      int mismatches = 0;
      for (int f = 1; f < kForms; ++f)
        for (size_t i = 0; i < ids[0].size(); ++i) mismatches += ids[0][i] != ids[f][i];
      std::printf("  mismatches %d\n", mismatches);
      failures += mismatches;
      CHECK(cudaFree(d_logits));
      CHECK(cudaFree(d_bias));
      CHECK(cudaFree(d_cycles));
      CHECK(cudaFree(d_ids));
    }
  }
  std::printf("%s\n", failures == 0 ? "ids agree" : "IDS DIFFER");
  return failures == 0 ? 0 : 1;
}
