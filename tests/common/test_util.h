// Shared test helpers: random inputs and error metrics.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace unimoe::test {

// A fresh seed per run (printed by the caller on failure) unless
// UNIMOE_TEST_SEED is set, so a failure can be replayed.
uint64_t fresh_seed();

inline std::vector<float> random_vector(std::size_t n, std::mt19937_64& rng, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// ||a - b|| / ||b||; NaN anywhere gives +inf so that it never passes.
inline double rel_l2(const float* a, const float* b, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return std::sqrt(num / den);
}

inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() ? rel_l2(a.data(), b.data(), a.size()) : INFINITY;
}

}  // namespace unimoe::test
