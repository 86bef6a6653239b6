// unimoe-bench --launch-floor: times the launch floor probe
// (kernels/launch_floor.cuh) in the launch shapes of the decode routing
// kernels, the way the routing sweep times them (kCallsPerGraph calls back
// to back in a graph, the median replay per call), and chains of 2 and 4
// probes a call (the split chain's kernel boundaries), each shape in the
// probe's four forms (empty; one load; one load and a block or cluster
// barrier; one load and a handoff to CTA 0 through an mbarrier). A routing call's time minus its shape's floor is what its
// kernels' work costs. Prints a table and writes JSON.
#include "bench.h"

#if defined(UNIMOE_WITH_CUDA)

#include <cuda_runtime.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "json_file.h"
#include "kernels/common/common.cuh"
#include "support/launch_floor.cuh"
#include "layer/graph_timing.h"

namespace unimoe::bench {
namespace {

constexpr int kCallsPerGraph = 8;  // as the routing sweep's

struct FloorShape {
  int ctas;
  int cluster_ctas;  // 0: no cluster attribute
  int threads;
  int chain;  // probes a call
};

// The fused kernel (one CTA), the cluster and spread kernels' clusters (2 to
// 16 CTAs, 16 non-portable) at a small and the largest block, and chains.
constexpr FloorShape kShapes[] = {
    {1, 0, 256, 1},  {1, 0, 1024, 1}, {2, 2, 256, 1},   {4, 4, 256, 1},  {8, 8, 256, 1},
    {16, 16, 256, 1}, {8, 8, 1024, 1}, {16, 16, 1024, 1}, {1, 0, 256, 2}, {1, 0, 256, 4}};

}  // namespace

int run_launch_floor(const LaunchFloorOptions& opt) {
  if (!gpu_or_explain("--launch-floor")) return 2;
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  UNIMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const DeviceMem word(2 * sizeof(int32_t));
  int most_threads = 1;
  for (const FloorShape& s : kShapes) most_threads = std::max(most_threads, s.ctas * s.threads);
  const DeviceMem src(std::size_t(most_threads) * sizeof(float));
  UNIMOE_CUDA_CHECK(cudaMemset(src.p, 0, std::size_t(most_threads) * sizeof(float)));
  constexpr FloorSteps kSteps[] = {FloorSteps::kEmpty, FloorSteps::kLoad, FloorSteps::kLoadBarrier,
                                   FloorSteps::kLoadHandoff, FloorSteps::kLoadCtaHandoff};

  nlohmann::json doc;
  doc["tool"] = "unimoe-bench --launch-floor";
  doc["version"] = kVersion;
  doc["device"] = prop.name;
  doc["calls_per_graph"] = kCallsPerGraph;
  doc["iters"] = opt.iters;
  doc["pdl"] = opt.pdl;
  doc["points"] = nlohmann::json::array();
  std::printf("launch floor on %s (PDL %s), %d calls a graph, median of %d replays\n", prop.name,
              opt.pdl ? "on" : "off", kCallsPerGraph, opt.iters);
  std::printf("us a call by the probe's form (empty; one load; one load, then a block barrier, or a\n"
              "cluster barrier where there are clusters; one load, then the other CTAs' warps hand off\n"
              "to CTA 0 through an mbarrier, a block barrier without clusters; the same with one\n"
              "arrival a CTA after a block barrier)\n");
  std::printf("%6s %8s %8s %6s %12s %12s %14s %14s %17s\n", "ctas", "cluster", "threads", "chain",
              "empty", "load", "load+barrier", "load+handoff", "load+cta-handoff");
  int wrong = 0;
  for (const FloorShape& s : kShapes) {
    std::printf("%6d %8d %8d %6d", s.ctas, s.cluster_ctas, s.threads, s.chain);
    for (FloorSteps steps : kSteps) {
      auto call = [&] {
        for (int c = 0; c < s.chain; ++c)
          launch_floor_probe(steps, s.ctas, s.cluster_ctas, s.threads, src.as<float>(),
                             word.as<int32_t>(), KernelStream(stream, opt.pdl));
      };
      UNIMOE_CUDA_CHECK(cudaMemsetAsync(word.p, 0xff, sizeof(int32_t), stream));
      cudaGraphExec_t g = capture(stream, [&] {
        for (int c = 0; c < kCallsPerGraph; ++c) call();
      });
      const double us = median_replay_us(g, stream, opt.iters, kCallsPerGraph);
      UNIMOE_CUDA_CHECK(cudaGraphExecDestroy(g));
      int32_t got = 0;
      UNIMOE_CUDA_CHECK(cudaMemcpy(&got, word.p, sizeof(got), cudaMemcpyDeviceToHost));
      const bool ran = got == s.ctas * s.threads;  // the probe wrote its grid's thread count
      wrong += !ran;
      const int width = steps == FloorSteps::kLoadCtaHandoff ? 17
                        : steps >= FloorSteps::kLoadBarrier   ? 14
                                                              : 12;
      std::printf(" %*.3f%s", width, us, ran ? "" : " (no word)");
      doc["points"].push_back({{"ctas", s.ctas},
                               {"cluster_ctas", s.cluster_ctas},
                               {"threads", s.threads},
                               {"chain", s.chain},
                               {"steps", floor_steps_name(steps)},
                               {"us", us},
                               {"ran", ran}});
    }
    std::printf("\n");
  }
  UNIMOE_CUDA_CHECK(cudaStreamDestroy(stream));
  write_json_file(doc, opt.json_path);
  std::printf("wrote %s\n", opt.json_path.c_str());
  return wrong == 0 ? 0 : 1;
}

}  // namespace unimoe::bench

#endif  // UNIMOE_WITH_CUDA (without it: gpu_runner.cpp)
