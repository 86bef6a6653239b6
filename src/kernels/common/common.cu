#include "kernels/common/common.cuh"

#include <cstdlib>
#include <cstring>

namespace unimoe {

bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

int env_int(const char* name, int unset) {
  const char* v = std::getenv(name);
  return v == nullptr ? unset : std::atoi(v);
}

int current_device_sm_count() {
  int device = 0, sm_count = 0;
  UNIMOE_CUDA_CHECK(cudaGetDevice(&device));
  UNIMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  return sm_count;
}

bool pdl_enabled() {
  static const bool enabled = env_switch_on("UNIMOE_PDL");
  return enabled;
}

}  // namespace unimoe
