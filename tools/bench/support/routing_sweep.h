// The grid of the routing sweep: which (policy, E, K, T) points
// `unimoe-bench --routing-sweep` times. Pure host code,
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
  // DeepSeekV3's groups where they fit (n_group; topk_group n_group / 2):
  // DeepSeek-V3's 8 by default; E / 32 times the wide choice at E != 256.
  int deepseek_groups = 8;
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
// DeepSeekV3 with grid.deepseek_groups groups where they fit (n_group G,
// topk_group G / 2, E divisible by G with at least 2 experts a group,
// K <= 22 and K <= G / 2 * E / G; G = 8, DeepSeek-V3's, by default),
// otherwise without groups; throws std::invalid_argument for G outside
// 2..16 (validate()'s n_group); DeepSeekV3 and MiniMax2 with a routing bias and scale
// 2.5. Logits fp32.
std::vector<RoutingSweepPoint> routing_sweep_points(const RoutingSweepGrid& grid);

}  // namespace unimoe
