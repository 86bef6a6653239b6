#include "common/test_util.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace unimoe::test {

uint64_t fresh_seed() {
  if (const char* s = std::getenv("UNIMOE_TEST_SEED")) return std::strtoull(s, nullptr, 0);
  static uint64_t counter = 0;
  const auto now = std::chrono::high_resolution_clock::now().time_since_epoch().count();
  return static_cast<uint64_t>(now) ^ (0x9E3779B97F4A7C15ull * ++counter);
}

}  // namespace unimoe::test
