// The routing plans the GPU tests launch with: as a layer of the test's
// routing config and rank would make them (plan_routing, with this
// device's probed capabilities), a variant forced, under development
// overrides that a test may change for a scope (ScopedDev).
#pragma once

#include "dev/overrides.h"
#include "kernels/routing/routing.cuh"
#include "plan/routing_plan.h"
#include "unimoe/unimoe.h"

namespace unimoe::test {

// The overrides test plans are made with: the environment's at start.
inline DevOverrides& routing_dev() {
  static DevOverrides dev = DevOverrides::from_environment();
  return dev;
}

// Sets one field of routing_dev() for a scope, then restores it.
template <typename T>
class ScopedDev {
 public:
  ScopedDev(T DevOverrides::*field, T value) : field_(field), old_(routing_dev().*field) {
    routing_dev().*field_ = value;
  }
  ~ScopedDev() { routing_dev().*field_ = old_; }
  ScopedDev(const ScopedDev&) = delete;
  ScopedDev& operator=(const ScopedDev&) = delete;

 private:
  T DevOverrides::*field_;
  T old_;
};

// The plan of a call of `num_tokens` tokens of `routing` on the rank
// [local_offset, local_offset + num_local) (num_local 0: every expert),
// with `variant` ("split", "fused", "cluster" or "auto").
inline RoutingPlan routing_plan(const RoutingConfig& routing, int local_offset, int num_local,
                                int num_tokens, bool precomputed, const char* variant) {
  MoEConfig c;
  c.routing = routing;
  c.experts.local_expert_offset = local_offset;
  c.experts.num_local_experts = num_local > 0 ? num_local : -1;
  c.options.routing_variant = variant;
  RoutingDeviceCaps caps;
  probe_routing_device_caps(routing, caps);
  return plan_routing(c, num_tokens, precomputed, caps, routing_dev());
}

}  // namespace unimoe::test
