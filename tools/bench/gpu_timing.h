// unimoe-bench's GPU helpers shared by the layer benchmark (gpu_runner.cpp)
// and the routing sweep (routing_sweep.cpp): device memory, graph capture
// and the median replay time.
#pragma once

#if defined(UNIMOE_WITH_CUDA)

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>

namespace unimoe::bench {

// Device memory freed on scope exit.
struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(std::size_t bytes);
  ~DeviceMem();
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p); }
};

// Captures `body` (launches on `stream`) once into a graph; a throwing body
// ends the capture first, so the stream stays usable.
cudaGraphExec_t capture(cudaStream_t stream, const std::function<void()>& body);

// Median over `iters` replays (after 3 warm-up replays) of the time of one
// replay, divided by `per`.
double median_replay_us(cudaGraphExec_t exec, cudaStream_t stream, int iters, int per);

}  // namespace unimoe::bench

#endif
