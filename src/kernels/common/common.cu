#include "kernels/common/common.cuh"

namespace unimoe {

int current_device_sm_count() {
  int device = 0, sm_count = 0;
  UNIMOE_CUDA_CHECK(cudaGetDevice(&device));
  UNIMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  return sm_count;
}

int current_device_l2_bytes() {
  int device = 0, bytes = 0;
  UNIMOE_CUDA_CHECK(cudaGetDevice(&device));
  UNIMOE_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device));
  return bytes;
}

int next_weights_max_tiles(std::size_t expert_bytes) {
  if (expert_bytes == 0) return 0;
  const std::size_t budget = static_cast<std::size_t>(current_device_l2_bytes()) * 2 / 5;
  return static_cast<int>(budget / expert_bytes);
}

}  // namespace unimoe
