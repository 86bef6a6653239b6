#include "support/routing_sweep.h"

#include <stdexcept>

namespace unimoe {
namespace {

constexpr int kMaxGroupedTopK = 22;

// The routing config of (policy, E, K), DeepSeekV3 in `groups` groups
// where they fit, or false when the point is illegal.
bool make_routing(RoutingPolicy policy, int e, int k, int groups, RoutingConfig* out) {
  if (k > e) return false;
  if (policy == RoutingPolicy::Llama4 && k != 1) return false;
  RoutingConfig r;
  r.policy = policy;
  r.num_experts = e;
  r.top_k = k;
  if (policy == RoutingPolicy::DeepSeekV3 || policy == RoutingPolicy::MiniMax2) {
    r.has_bias = true;
    r.routed_scaling_factor = 2.5f;
  }
  const int kept = groups / 2;
  if (policy == RoutingPolicy::DeepSeekV3 && e % groups == 0 && e / groups >= 2 &&
      k <= kept * (e / groups) && k <= kMaxGroupedTopK) {
    r.n_group = groups;
    r.topk_group = kept;
  }
  if (!legal_routing(r)) return false;
  *out = r;
  return true;
}

}  // namespace

bool legal_routing(const RoutingConfig& routing) {
  MoEConfig c;
  c.routing = routing;
  c.experts.hidden = 128;
  c.experts.intermediate = 128;
  try {
    validate(c);
    return true;
  } catch (const Error&) {
    return false;
  }
}

RoutingSweepGrid default_routing_sweep_grid() {
  RoutingSweepGrid g;
  for (RoutingPolicy p :
       {RoutingPolicy::Default, RoutingPolicy::Renormalize, RoutingPolicy::RenormalizeNaive,
        RoutingPolicy::DeepSeekV3, RoutingPolicy::Llama4, RoutingPolicy::TopK,
        RoutingPolicy::Sigmoid, RoutingPolicy::SigmoidRenorm, RoutingPolicy::TopKSigmoid,
        RoutingPolicy::MiniMax2})
    g.policies.push_back(p);
  g.experts = {8, 64, 128, 160, 256, 384, 512, 1024};
  g.top_k = {1, 2, 4, 6, 8, 10, 16, 22, 32};
  for (int t = 1; t <= 16; ++t) g.tokens.push_back(t);
  for (int t : {24, 32, 48, 64, 96, 128}) g.tokens.push_back(t);
  for (int t = 256; t <= 16384; t *= 2) g.tokens.push_back(t);
  return g;
}

std::string RoutingSweepPoint::label() const {
  return to_string(routing.policy) + " E=" + std::to_string(routing.num_experts) +
         " K=" + std::to_string(routing.top_k) + " T=" + std::to_string(num_tokens);
}

std::vector<RoutingSweepPoint> routing_sweep_points(const RoutingSweepGrid& grid) {
  if (grid.deepseek_groups < 2 || grid.deepseek_groups > 16)
    throw std::invalid_argument("routing sweep: DeepSeekV3 groups must be 2..16, got " +
                                std::to_string(grid.deepseek_groups));
  std::vector<RoutingSweepPoint> points;
  for (RoutingPolicy policy : grid.policies)
    for (int e : grid.experts)
      for (int k : grid.top_k) {
        RoutingConfig r;
        if (!make_routing(policy, e, k, grid.deepseek_groups, &r)) continue;
        for (int t : grid.tokens) {
          if (t < 1) throw std::invalid_argument("routing sweep: T must be >= 1, got " + std::to_string(t));
          points.push_back(RoutingSweepPoint{r, t});
        }
      }
  return points;
}

}  // namespace unimoe
