// Routing on the device: logits [T, E] -> topk_ids [T, K], topk_weights [T, K].
// Every policy of DESIGN.md, bit-for-bit the selection of the CPU reference
// (src/ref/routing.cpp, docs/routing.md); weights within 1e-6 relative.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/routing_launch_shape.h"
#include "kernels/permute/permute.cuh"
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

// `counts` (optional): the permute's count table (permute_counts), which
// the routing kernel also writes where routing_writes_counts says it can;
// launch_permute then leaves its count kernel out (counted = true).
void launch_routing(const RoutingParams& params, cudaStream_t stream,
                    const PermuteCounts* counts = nullptr);

// Whether launch_routing writes `counts` too: where the octet kernel routes
// the call (split_takes_octets) and a chunk is up to 8 of its blocks
// (routing_shape::octet_count_blocks), for the same T * K rows; never
// where UNIMOE_SPLIT_OCTET_COUNT is "0" (read once; for A/B timing). Pure
// host code: the layer's permute stage asks it again.
bool routing_writes_counts(const RoutingParams& params, const PermuteCounts& counts);

// The split chain: launch_routing, then launch_permute over the routing's
// ids (permute.topk_ids == routing.topk_ids, the same T and K), the count
// folded into the routing where routing_writes_counts says.
void launch_split_routing_permute(const RoutingParams& routing, const PermuteParams& permute,
                                  cudaStream_t stream);

// What a policy's weight costs the routing kernel
// (routing_shape::SplitWeight), and whether the kernel weighs each block's
// tokens together for T tokens (routing_shape::split_weighs_in_batches;
// UNIMOE_SPLIT_BATCH_MIN_TOKENS, read once, replaces its bound, for sweeps).
routing_shape::SplitWeight split_weight(RoutingPolicy policy);
bool split_weighs_in_batches(int num_tokens, RoutingPolicy policy);

}  // namespace unimoe
