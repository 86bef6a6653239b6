#include "layer/graph_timing.h"

#include <algorithm>
#include <vector>

#include "kernels/common.cuh"

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

}  // namespace unimoe
