// Routing and sort/permute fused into one launch of one thread block (or one
// thread-block cluster, below), for
// small inputs where the fixed cost of launch_routing + launch_permute (four
// launches) dominates. Writes exactly what those two write (contracts:
// routing.cuh, permute.cuh): topk_ids, topk_weights, expert counts and
// offsets, both row maps, every requested tile schedule and its tile count.
// Graph-safe: no host sync, no scratch; T = 0 still writes counts, offsets
// and tile counts (all 0).
//
// Two modes, chosen by routing.logits:
//   - routing (logits set): routes routing.num_tokens tokens into
//     routing.topk_ids / topk_weights and permutes them; permute.topk_ids is
//     not read and must be null or routing.topk_ids.
//   - precomputed (logits null): permutes the ids in permute.topk_ids as
//     given; of `routing` nothing is read, and nothing is written to its
//     outputs.
// T, K and the rank's expert range come from `permute`; in routing mode they
// must agree with routing.num_tokens and routing.config.top_k.
#pragma once

#include <cuda_runtime.h>

#include "core/routing_launch_shape.h"
#include "core/routing_limits.h"
#include "core/routing_plan.h"
#include "kernels/common/common.cuh"
#include "kernels/permute/permute.cuh"
#include "kernels/routing/routing.cuh"

namespace unimoe {

// The largest inputs one block serves: T * K expanded rows and E_local.
inline constexpr int kFusedMaxRows = routing_limits::kFusedMaxRows;
inline constexpr int kFusedMaxLocalExperts = routing_limits::kFusedMaxLocalExperts;

// Launches the fused-kind kernel the plan names (plan_routing,
// plan/routing_plan.h): PermuteOnly (ids given, or no rows), Block (one
// block routes every token and permutes), Cluster (CTA 0 of a thread-block
// cluster permutes every row, reading the rows' experts that CTAs 1..
// wrote into its shared memory, while they weigh their experts) or Spread
// (every CTA of a cluster of up to 16 routes its run of tokens and places
// its own rows, counting each expert's rows across the cluster in
// distributed shared memory). The launch shape, the kernel's selection and
// its twins (wide choice, direct keys) come from the plan; this function
// decides nothing. Throws std::invalid_argument for inputs that do not fit
// the fused kernels (T * K <= kFusedMaxRows, E_local <= kFusedMaxLocalExperts)
// or that disagree with each other or with the plan.
void launch_fused_routing_permute(const RoutingParams& routing, const PermuteParams& permute,
                                  const RoutingPlan& plan, KernelStream stream);

// Fills caps.cluster_runs_16 and caps.spread_runs_16 for `config`'s
// kernels: whether the device runs them in clusters of 16 CTAs. Also lets
// those kernels launch such clusters (the non-portable size attribute):
// call it before launching a plan made with the caps it filled.
void probe_fused_routing_caps(const RoutingConfig& config, RoutingDeviceCaps& caps);

}  // namespace unimoe
