// The DeepSeek group stage's expert -> group map without an integer
// division, shared by the routing kernels and a CPU test that checks it.
// Usable from host and device code (no CUDA header needed).
#pragma once

#include "core/host_device.h"

namespace unimoe {

// The reciprocal the map multiplies by, rounded to nearest in fp32.
UNIMOE_HD float inverse_group_size(int experts_per_group) {
  return 1.0f / static_cast<float>(experts_per_group);
}

// e / experts_per_group for 0 <= e < 1024 and 1 <= experts_per_group <=
// 1024, given inverse_group_size(experts_per_group). Exact: (e + 0.5) / d
// lies at least 0.5 / d >= 2^-11 from an integer, and the two fp32
// roundings move it by under 2^-13 (tests/cpu/test_routing.cpp checks
// every pair).
UNIMOE_HD int group_index(int e, float inverse_size) {
  return static_cast<int>((static_cast<float>(e) + 0.5f) * inverse_size);
}

}  // namespace unimoe
