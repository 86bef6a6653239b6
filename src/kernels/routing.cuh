// Routing on the device: logits [T, E] -> topk_ids [T, K], topk_weights [T, K].
// Every policy of DESIGN.md, bit-for-bit the selection of the CPU reference
// (src/ref/routing.cpp, docs/routing.md); weights within 1e-6 relative.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "unimoe/unimoe.h"

namespace unimoe {

struct RoutingParams {
  const void* logits = nullptr;  // [T, E], fp32 or bf16 per config.logits_type
  const float* bias = nullptr;   // [E] when config.has_bias
  int num_tokens = 0;            // T
  RoutingConfig config;
  int32_t* topk_ids = nullptr;      // [T, K] out
  float* topk_weights = nullptr;    // [T, K] out
};

void launch_routing(const RoutingParams& params, cudaStream_t stream);

}  // namespace unimoe
