// The grid of the routing sweep (issue: routing kernel family): which
// (policy, E, K, T) points `unimoe-routing-sweep` times. Pure host code,
// tested on the CPU (tests/cpu/test_routing_sweep.cpp).
#pragma once

#include <string>
#include <vector>

#include "unimoe/unimoe.h"

namespace unimoe {

struct RoutingSweepGrid {
  std::vector<RoutingPolicy> policies;
  std::vector<int> experts;  // E
  std::vector<int> top_k;    // K
  std::vector<int> tokens;   // T
};

// The default grid: every policy; E in {8, 64, 128, 160, 256, 384, 512,
// 1024}; K in {1, 2, 4, 6, 8, 10, 16, 22, 32}; T = 1..16 dense, then
// 24, 32, 48, 64, 96, 128 and powers of two up to 16384.
RoutingSweepGrid default_routing_sweep_grid();

// Whether validate() accepts a layer with this routing (the experts part is
// a small legal filler).
bool legal_routing(const RoutingConfig& routing);

// One point of the sweep: the routing config and T.
struct RoutingSweepPoint {
  RoutingConfig routing;
  int num_tokens = 0;
  std::string label() const;  // "DeepSeekV3 E=256 K=8 T=64"
};

// Every legal point of the grid, policies outermost, T innermost. Legal:
// K <= E and validate() accepts the config; Llama4 only with K = 1;
// DeepSeekV3 with the DeepSeek-V3 grouping where it fits (n_group 8,
// topk_group 4, E divisible by 8 with at least 2 experts a group, K <= 22
// and K <= 4 * E / 8), otherwise without groups; DeepSeekV3 and MiniMax2 with a routing bias and scale
// 2.5. Logits fp32.
std::vector<RoutingSweepPoint> routing_sweep_points(const RoutingSweepGrid& grid);

}  // namespace unimoe
