// Small device helpers shared by the kernel families, and the CUDA error check
// every launcher uses.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace unimoe {

// Throws std::runtime_error naming the call, file and line.
#define UNIMOE_CUDA_CHECK(expr)                                                        \
  do {                                                                                 \
    const cudaError_t unimoe_err_ = (expr);                                            \
    if (unimoe_err_ != cudaSuccess)                                                    \
      throw std::runtime_error(std::string(#expr) + " failed at " + __FILE__ + ":" +   \
                               std::to_string(__LINE__) + ": " +                       \
                               cudaGetErrorString(unimoe_err_));                       \
  } while (0)

// After a launch: catches bad configurations without synchronizing.
#define UNIMOE_LAUNCH_CHECK() UNIMOE_CUDA_CHECK(cudaGetLastError())

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace unimoe
