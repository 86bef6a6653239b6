#include "kernels/common.cuh"

#include <cstdlib>
#include <cstring>

namespace unimoe {

bool pdl_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("UNIMOE_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

}  // namespace unimoe
