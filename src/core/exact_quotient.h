// Integer division by a divisor known when the kernel launches, as one fp32
// multiply by the divisor's reciprocal (computed on the host): a routing
// kernel's divisions by K, a group size or a tile size otherwise cost about
// 20 dependent instructions each. Host and device (UNIMOE_HD), no CUDA
// header; tests/cpu/test_routing.cpp checks it against integer division.
#pragma once

#include "core/host_device.h"

namespace unimoe {

// The reciprocal exact_quotient multiplies by, rounded to nearest in fp32.
UNIMOE_HD float inverse_of(int divisor) { return 1.0f / static_cast<float>(divisor); }

// The largest dividend exact_quotient is exact for.
inline constexpr int kExactQuotientMax = (1 << 21) - 1;

// n / d for 0 <= n <= kExactQuotientMax and d >= 1, given inverse_of(d).
// Exact: (n + 0.5) / d = (2n + 1) / 2d lies at least 1 / 2d from an
// integer (an odd numerator over an even denominator), and the two fp32
// roundings (of 1 / d and of the product) move it by at most
// (n + 0.5) / d * 2^-23 < 1 / 2d while n + 0.5 < 2^22.
UNIMOE_HD int exact_quotient(int n, float inverse) {
  return static_cast<int>((static_cast<float>(n) + 0.5f) * inverse);
}

}  // namespace unimoe
