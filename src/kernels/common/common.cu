#include "kernels/common/common.cuh"

namespace unimoe {

int current_device_sm_count() {
  int device = 0, sm_count = 0;
  UNIMOE_CUDA_CHECK(cudaGetDevice(&device));
  UNIMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  return sm_count;
}

}  // namespace unimoe
