// Routing on the device: logits [T, E] -> topk_ids [T, K], topk_weights [T, K].
// Every policy of DESIGN.md, bit-for-bit the selection of the CPU reference
// (src/ref/routing.cpp, docs/routing.md); weights within 1e-6 relative.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/routing_launch_shape.h"
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

// What a policy's weight costs the routing kernel
// (routing_shape::SplitWeight), and whether the kernel weighs each block's
// tokens together for T tokens (routing_shape::split_weighs_in_batches;
// UNIMOE_SPLIT_BATCH_MIN_TOKENS, read once, replaces its bound, for sweeps).
routing_shape::SplitWeight split_weight(RoutingPolicy policy);
bool split_weighs_in_batches(int num_tokens, RoutingPolicy policy);

}  // namespace unimoe
