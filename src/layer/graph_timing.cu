#include "layer/graph_timing.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/common/common.cuh"
#include "plan/autotune.h"

namespace unimoe {

DeviceMem::DeviceMem(std::size_t bytes) { UNIMOE_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1)); }
DeviceMem::~DeviceMem() { cudaFree(p); }

cudaGraphExec_t capture(cudaStream_t stream, const std::function<void()>& body) {
  cudaGraph_t graph = nullptr;
  UNIMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    body();
  } catch (...) {
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    throw;
  }
  UNIMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  UNIMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  return exec;
}

double median_replay_us(cudaGraphExec_t exec, cudaStream_t stream, int iters, int per) {
  cudaEvent_t start, stop;
  UNIMOE_CUDA_CHECK(cudaEventCreate(&start));
  UNIMOE_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    UNIMOE_CUDA_CHECK(cudaEventRecord(start, stream));
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    UNIMOE_CUDA_CHECK(cudaEventRecord(stop, stream));
    UNIMOE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    UNIMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(1000.0 * ms / per);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

double median_forward_us(MoELayer& layer, const std::vector<ForwardArgs>& sets,
                         cudaStream_t stream, int iters) {
  cudaGraphExec_t graph = capture(stream, [&] {
    for (const ForwardArgs& args : sets) layer.forward(args, stream);
  });
  try {
    const double us = median_replay_us(graph, stream, iters, static_cast<int>(sets.size()));
    cudaGraphExecDestroy(graph);
    return us;
  } catch (...) {
    cudaGraphExecDestroy(graph);
    throw;
  }
}

double forward_error(MoELayer& layer, const ForwardArgs& args, const std::vector<float>& want,
                     cudaStream_t stream) {
  const std::size_t out_bytes =
      static_cast<std::size_t>(args.num_tokens) * layer.config().experts.hidden * 2;
  UNIMOE_CUDA_CHECK(cudaMemsetAsync(args.out, 0xff, out_bytes, stream));
  layer.forward(args, stream);
  std::vector<uint16_t> got_bits(want.size());
  UNIMOE_CUDA_CHECK(cudaMemcpyAsync(got_bits.data(), args.out, got_bits.size() * 2,
                                    cudaMemcpyDeviceToHost, stream));
  UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return relative_l2_error(got_bits, want);
}

}  // namespace unimoe
