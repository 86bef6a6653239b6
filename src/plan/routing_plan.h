// The routing plan of one call size: a pure host function of (config, T,
// precomputed or not, device capabilities, development overrides), tested
// on the CPU (tests/cpu/test_routing_plan.cpp). The layer and the routing
// sweep launch through the same function with it.
#pragma once

#include "core/routing_launch_shape.h"
#include "core/routing_plan.h"
#include "dev/overrides.h"
#include "unimoe/unimoe.h"

namespace unimoe {

// The rule between the variants for T tokens, fitted to the H200 routing
// sweep (the constants and figures in routing_plan.cpp): Cluster while the
// call is small enough for it, else Split. It never picks Fused: the
// cluster variant launches the fused block itself where one CTA routes
// every token.
RoutingVariant routing_variant_for(const RoutingConfig& routing, int num_tokens);

// How the split chain's routing kernel weighs a policy's chosen experts
// (the weighing in batches is measured per kind: routing_shape).
routing_shape::SplitWeight split_weight(RoutingPolicy policy);

// The plan for a call of `num_tokens` tokens of `config` (its routing and
// expert range; options.routing_variant forces a variant where its kernel
// serves), `precomputed` when the caller passes ids and weights.
RoutingPlan plan_routing(const MoEConfig& config, int num_tokens, bool precomputed,
                         const RoutingDeviceCaps& caps, const DevOverrides& dev);

}  // namespace unimoe
