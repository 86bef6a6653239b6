// Routing on the device: logits [T, E] -> topk_ids [T, K], topk_weights [T, K].
// Every policy of docs/routing.md, bit-for-bit the selection of the CPU reference
// (src/ref/routing.cpp, docs/routing.md); weights within 1e-6 relative.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/routing_launch_shape.h"
#include "core/routing_plan.h"
#include "kernels/common/common.cuh"
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

// The split chain's routing kernel the plan names (SplitWarps or
// SplitOctets; None launches nothing), over params.num_tokens tokens.
// `counts` (nullptr: none): the permute's chunk counts, which the octet
// kernel writes as well where plan.routing_counts_rows (then it must be
// permute_counts(permute) of the call's permute). Throws
// std::invalid_argument for a config outside the kernels' limits or a plan
// that does not fit the call.
void launch_routing(const RoutingParams& params, const RoutingPlan& plan, KernelStream stream,
                    const PermuteCounts* counts = nullptr);

// Routing and permute as the layer and the routing sweep run them, in two
// stages so that the benchmark can time each: launch_routing_stage runs the
// fused-kind kernel (which permutes too) or the split chain's routing
// kernel; launch_permute_stage runs the split chain's permute (nothing for
// the fused kinds). The plan comes from plan_routing (plan/routing_plan.h).
void launch_routing_stage(const RoutingParams& routing, const PermuteParams& permute,
                          const RoutingPlan& plan, KernelStream stream);
void launch_permute_stage(const PermuteParams& permute, const RoutingPlan& plan,
                          KernelStream stream);
inline void launch_routing_permute(const RoutingParams& routing, const PermuteParams& permute,
                                   const RoutingPlan& plan, KernelStream stream) {
  launch_routing_stage(routing, permute, plan, stream);
  launch_permute_stage(permute, plan, stream);
}

// What the plan needs to know of the device for `config` (plan/routing_plan.h):
// its SM count and the cluster sizes its routing kernels run. Lets those
// kernels launch the clusters it reports: call it once (per device and
// config) before launching a plan made with these caps.
void probe_routing_device_caps(const RoutingConfig& config, RoutingDeviceCaps& caps);

}  // namespace unimoe
