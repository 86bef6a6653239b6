// The DeepSeek group stage's expert -> group map without an integer
// division, shared by the routing kernels and a CPU test that checks it.
// Usable from host and device code (no CUDA header needed).
#pragma once

#include "core/exact_quotient.h"
#include "core/host_device.h"

namespace unimoe {

// The reciprocal the map multiplies by, rounded to nearest in fp32.
UNIMOE_HD float inverse_group_size(int experts_per_group) { return inverse_of(experts_per_group); }

// e / experts_per_group for 0 <= e < 1024 and 1 <= experts_per_group <=
// 1024, given inverse_group_size(experts_per_group): exact_quotient
// (tests/cpu/test_routing.cpp checks every pair).
UNIMOE_HD int group_index(int e, float inverse_size) { return exact_quotient(e, inverse_size); }

}  // namespace unimoe
