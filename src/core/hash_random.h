// Counter-based random numbers: value i of stream `seed` is a pure function
// of (seed, i), so the host and the device draw the same inputs without
// copying them, and the CPU reference can regenerate only the experts it needs.
// Usable from host and device code (no CUDA header needed).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace unimoe {

// splitmix64 finalizer: a bijection with good avalanche.
UNIMOE_HD uint64_t hash64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1), 24 bits of resolution.
UNIMOE_HD float hash_uniform(uint64_t seed, uint64_t i) {
  const uint64_t h = hash64(hash64(seed) ^ i);
  return static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}

}  // namespace unimoe
