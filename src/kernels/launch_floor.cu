#include <cooperative_groups.h>

#include <stdexcept>
#include <string>

#include "kernels/common.cuh"
#include "kernels/launch_floor.cuh"

namespace unimoe {
namespace {

constexpr int kMaxClusterCtas = 16;  // the non-portable limit on sm_90

template <FloorSteps kSteps, bool kCluster>
__global__ void launch_floor_kernel(const float* src, int32_t* word) {
  pdl_begin();
  pdl_launch_dependents();
  float v = 0.0f;
  if constexpr (kSteps != FloorSteps::kEmpty) v = src[blockIdx.x * blockDim.x + threadIdx.x];
  if constexpr (kSteps == FloorSteps::kLoadBarrier) {
    if constexpr (kCluster) cooperative_groups::this_cluster().sync();
    else __syncthreads();
  }
  if (v != 0.0f) word[1] = static_cast<int32_t>(v);
  if (blockIdx.x == 0 && threadIdx.x == 0) word[0] = static_cast<int32_t>(gridDim.x * blockDim.x);
}

template <FloorSteps kSteps, bool kCluster>
void launch_steps(int ctas, int cluster_ctas, int threads, const float* src, int32_t* word,
                  cudaStream_t stream) {
  auto* kernel = launch_floor_kernel<kSteps, kCluster>;
  if (cluster_ctas > 8) {
    static const cudaError_t allowed =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    UNIMOE_CUDA_CHECK(allowed);
  }
  launch_pdl_clustered(kernel, dim3(ctas), dim3(threads), 0, cluster_ctas, stream, src, word);
}

template <FloorSteps kSteps>
void launch_clustered_or_not(int ctas, int cluster_ctas, int threads, const float* src,
                             int32_t* word, cudaStream_t stream) {
  if (cluster_ctas > 0) launch_steps<kSteps, true>(ctas, cluster_ctas, threads, src, word, stream);
  else launch_steps<kSteps, false>(ctas, cluster_ctas, threads, src, word, stream);
}

}  // namespace

const char* floor_steps_name(FloorSteps steps) {
  switch (steps) {
    case FloorSteps::kEmpty: return "empty";
    case FloorSteps::kLoad: return "load";
    case FloorSteps::kLoadBarrier: return "load+barrier";
  }
  return "?";
}

void launch_floor_probe(FloorSteps steps, int ctas, int cluster_ctas, int threads, const float* src,
                        int32_t* word, cudaStream_t stream) {
  const auto require = [](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument("launch_floor_probe: " + message);
  };
  require(ctas >= 1, "ctas must be >= 1");
  require(threads >= 32 && threads <= 1024 && threads % 32 == 0,
          "threads must be a multiple of 32 in 32..1024");
  require(cluster_ctas >= 0 && cluster_ctas <= kMaxClusterCtas, "cluster_ctas must be 0..16");
  require(cluster_ctas == 0 || ctas % cluster_ctas == 0, "ctas must be whole clusters");
  require(word != nullptr, "word must not be null");
  require(steps == FloorSteps::kEmpty || src != nullptr, "src must not be null where it is read");
  switch (steps) {
    case FloorSteps::kEmpty:
      launch_clustered_or_not<FloorSteps::kEmpty>(ctas, cluster_ctas, threads, src, word, stream);
      break;
    case FloorSteps::kLoad:
      launch_clustered_or_not<FloorSteps::kLoad>(ctas, cluster_ctas, threads, src, word, stream);
      break;
    case FloorSteps::kLoadBarrier:
      launch_clustered_or_not<FloorSteps::kLoadBarrier>(ctas, cluster_ctas, threads, src, word, stream);
      break;
  }
}

}  // namespace unimoe
