// Shared by the fused routing GPU tests (test_fused_routing_gpu.cu,
// test_fused_permute_paths_gpu.cu, test_cluster_routing_gpu.cu,
// test_routing_selection_gpu.cu): the logits types they sweep, the cluster
// variant's spread kernel set for a scope, and whether it serves a problem.
#pragma once

#include "common/routing_cases.h"
#include "core/routing_launch_shape.h"
#include "dev/overrides.h"
#include "gpu/fused_routing_rig.h"
#include "gpu/routing_plan_util.h"
#include "kernels/routing/routing_device.cuh"

namespace unimoe::test {
// Its own inline namespace: routing_gpu_cases.h has a kTypes too.
inline namespace fused_routing_cases {

inline constexpr LogitsType kTypes[] = {LogitsType::F32, LogitsType::BF16};

// The cluster variant's use of the spread kernel for a scope: on, its
// largest cluster (0: the device's largest) and the tokens it serves from
// (0: the measured rule).
struct SpreadSetting {
  bool on;
  int max_ctas;
  int from_tokens;
};
struct ScopedSpread {
  explicit ScopedSpread(SpreadSetting s)
      : on(&DevOverrides::cluster_spread, s.on),
        max_ctas(&DevOverrides::spread_max_ctas, s.max_ctas),
        from_tokens(&DevOverrides::spread_from_tokens, s.from_tokens) {}
  ScopedDev<bool> on;
  ScopedDev<int> max_ctas, from_tokens;
};

// Whether the cluster variant launches the spread kernel for pr, at most
// max_ctas CTAs (routing_shape::spread_shape at the launcher's default
// minimum tokens; the device's largest cluster is at least 8).
inline bool spread_serves(const RoutingProblem& pr, int max_ctas) {
  const bool deepseek = routing_detail::is_deepseek(pr.config.policy);
  const int per_lane = routing_detail::slots_per_lane(pr.config.num_experts);
  return routing_shape::spread_shape(per_lane, pr.num_tokens, pr.local(), pr.config.num_experts,
                                     deepseek, routing_shape::default_spread_min_tokens(deepseek),
                                     max_ctas)
             .ctas > 0;
}

}  // namespace fused_routing_cases
}  // namespace unimoe::test
