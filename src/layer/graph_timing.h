// Timing by CUDA-graph replay, shared by MoELayer::autotune
// (layer/autotune.cu) and unimoe-bench (the layer benchmark and the routing
// sweep): device memory, graph capture and the median replay time.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "unimoe/unimoe.h"

namespace unimoe {

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

// The forward of every args in `sets`, captured in one graph: the median
// replay time (median_replay_us, `iters` replays) per forward.
double median_forward_us(MoELayer& layer, const std::vector<ForwardArgs>& sets,
                         cudaStream_t stream, int iters);

// Relative L2 error against `want` (the first want.size() outputs, fp32) of a
// fresh forward of `args`, whose out is poisoned first (relative_l2_error,
// plan/autotune.h). Synchronizes `stream`.
double forward_error(MoELayer& layer, const ForwardArgs& args, const std::vector<float>& want,
                     cudaStream_t stream);

}  // namespace unimoe
