#include "kernels/common.cuh"

#include <cstdlib>
#include <cstring>

namespace unimoe {

bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

bool pdl_enabled() {
  static const bool enabled = env_switch_on("UNIMOE_PDL");
  return enabled;
}

}  // namespace unimoe
