#include "kernels/common.cuh"

#include <cstdlib>
#include <cstring>

namespace unimoe {

bool pdl_early_dependents_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("UNIMOE_PDL_EARLY");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return enabled;
}

bool pdl_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("UNIMOE_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

}  // namespace unimoe
