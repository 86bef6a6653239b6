// unimoe-bench --stream-patterns: times one read of a weight matrix with
// each access pattern of support/stream_patterns.cuh, at the byte counts of
// the decode GEMMs (dsv3-tp8 T=1: GEMM1 ~59 MB of K = 7168 rows, GEMM2
// ~29 MB of K = 256 rows) and at 1 GiB (steady state). Copies of the matrix
// are rotated so that no read finds its bytes in L2. Prints the time per
// read and TB/s, and writes them as JSON.
#include "bench.h"

#if defined(UNIMOE_WITH_CUDA)

#include <cuda_runtime.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <vector>

#include "json_file.h"
#include "kernels/common/common.cuh"
#include "kernels/common/fill.cuh"
#include "support/stream_patterns.cuh"
#include "layer/graph_timing.h"

namespace unimoe::bench {
namespace {

struct Shape {
  const char* name;
  long long bytes;  // about; rows are rounded down to a multiple of 16
  int k;
  int k_chunk;
};

// K per warp as the stream kernel splits it: GEMM1's H over 8 warps (7168 /
// 8 = 896, here 1024 of 8192), GEMM2's I = 256 whole.
constexpr Shape kShapes[] = {{"gemm1-like 59MB", 59LL << 20, 8192, 1024},
                             {"gemm2-like 29MB", 29LL << 20, 256, 256},
                             {"steady 1GiB", 1LL << 30, 8192, 1024}};
constexpr long long kRotateBytes = 256LL << 20;  // copies of a shape cover this (L2 is 50 MB)
constexpr int kWarmup = 2;

}  // namespace

int run_stream_patterns(const StreamPatternOptions& opt) {
  if (!gpu_or_explain("--stream-patterns")) return 2;
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  UNIMOE_CUDA_CHECK(cudaEventCreate(&start));
  UNIMOE_CUDA_CHECK(cudaEventCreate(&stop));
  cudaDeviceProp prop{};
  UNIMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

  nlohmann::json doc;
  doc["tool"] = "unimoe-bench --stream-patterns";
  doc["device"] = prop.name;
  doc["reads"] = opt.reads;
  doc["points"] = nlohmann::json::array();
  std::printf("weight-streaming patterns on %s, %d reads each (us per read, TB/s)\n", prop.name,
              opt.reads);
  for (const Shape& shape : kShapes) {
    const long long rows = shape.bytes / (2LL * shape.k) / 16 * 16;
    const long long bytes = rows * shape.k * 2;
    const int copies = static_cast<int>(bytes >= kRotateBytes ? 1 : (kRotateBytes + bytes - 1) / bytes);
    std::vector<std::unique_ptr<DeviceMem>> mats;
    for (int c = 0; c < copies; ++c) {
      mats.push_back(std::make_unique<DeviceMem>(static_cast<std::size_t>(bytes)));
      launch_fill_bf16(mats.back()->as<uint16_t>(), static_cast<std::size_t>(bytes / 2), 11 + c, 1.0f,
                       stream);
    }
    StreamPatternArgs args;
    args.rows = rows;
    args.k = shape.k;
    args.k_chunk = shape.k_chunk;
    const long long ctas = stream_pattern_ctas(args);
    DeviceMem sink(static_cast<std::size_t>(ctas) * sizeof(uint32_t));
    args.sink = sink.as<uint32_t>();
    std::printf("%-18s %lld rows x K %d, %.1f MB, %lld CTAs, %d copies\n", shape.name, rows, shape.k,
                bytes / 1e6, ctas, copies);
    for (StreamPattern pattern : kStreamPatterns) {
      auto read = [&](int i) {
        args.w = mats[i % copies]->as<uint16_t>();
        launch_stream_pattern(pattern, args, stream);
      };
      for (int i = 0; i < kWarmup; ++i) read(i);
      UNIMOE_CUDA_CHECK(cudaEventRecord(start, stream));
      for (int i = 0; i < opt.reads; ++i) read(kWarmup + i);
      UNIMOE_CUDA_CHECK(cudaEventRecord(stop, stream));
      UNIMOE_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      UNIMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      const double us = 1e3 * ms / opt.reads;
      const double tbs = bytes / (us * 1e-6) / 1e12;
      std::printf("  %-12s %10.2f us %7.3f TB/s\n", stream_pattern_name(pattern), us, tbs);
      doc["points"].push_back({{"shape", shape.name},
                               {"rows", rows},
                               {"k", shape.k},
                               {"k_chunk", shape.k_chunk},
                               {"bytes", bytes},
                               {"ctas", ctas},
                               {"pattern", stream_pattern_name(pattern)},
                               {"us", us},
                               {"tb_per_s", tbs}});
    }
  }
  UNIMOE_CUDA_CHECK(cudaEventDestroy(start));
  UNIMOE_CUDA_CHECK(cudaEventDestroy(stop));
  UNIMOE_CUDA_CHECK(cudaStreamDestroy(stream));
  write_json_file(doc, opt.json_path);
  std::printf("wrote %s\n", opt.json_path.c_str());
  return 0;
}

}  // namespace unimoe::bench

#endif  // UNIMOE_WITH_CUDA (without it: gpu_runner.cpp)
