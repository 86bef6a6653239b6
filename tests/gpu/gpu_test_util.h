// Helpers for GPU tests: skip with a clear message where no GPU is usable,
// device buffers that free themselves, and bf16 conversions for checks.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/common.cuh"

namespace unimoe::test {

// Empty when a CUDA device of compute capability 9.0 is usable, else the reason.
inline std::string gpu_unavailable_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  if (count == 0) return "no CUDA device";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "cannot read device properties";
  if (prop.major != 9) return std::string("device ") + prop.name + " is not sm_90 (Hopper)";
  return "";
}

#define UNIMOE_REQUIRE_GPU()                                                      \
  do {                                                                            \
    const std::string unimoe_reason_ = ::unimoe::test::gpu_unavailable_reason(); \
    if (!unimoe_reason_.empty()) GTEST_SKIP() << "GPU test skipped: " << unimoe_reason_; \
  } while (0)

// A device allocation of n elements of T, freed on scope exit.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n) UNIMOE_CUDA_CHECK(cudaMalloc(&ptr_, n * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }

  T* get() const { return ptr_; }
  std::size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    UNIMOE_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), std::min(n_, host.size()) * sizeof(T),
                                 cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) UNIMOE_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // Fills every byte with `byte` (poisoning: 0xff gives NaN for floats and bf16, -1 for ints).
  void poison(int byte = 0xff) {
    if (n_) UNIMOE_CUDA_CHECK(cudaMemset(ptr_, byte, n_ * sizeof(T)));
  }

 private:
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
};

// Calls launch(p) and expects it to throw an `Exception` whose message
// contains `words` (a launcher's refusal names the bad field).
template <class Exception, typename Params, typename Launch>
void expect_refused(const Params& p, const std::string& words, Launch launch) {
  try {
    launch(p);
    ADD_FAILURE() << "accepted; expected a refusal saying " << words;
  } catch (const Exception& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

// Captures what `body` launches on `stream` into a new graph. If `body`
// throws, the capture is ended (its graph dropped) before the exception goes
// on: a stream left capturing would make the next test's allocations fail.
template <typename Body>
cudaGraph_t capture(cudaStream_t stream, cudaStreamCaptureMode mode, Body&& body) {
  UNIMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, mode));
  try {
    body();
  } catch (...) {
    cudaGraph_t dropped = nullptr;
    cudaStreamEndCapture(stream, &dropped);
    if (dropped != nullptr) cudaGraphDestroy(dropped);
    throw;
  }
  cudaGraph_t graph = nullptr;
  UNIMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  return graph;
}

}  // namespace unimoe::test
