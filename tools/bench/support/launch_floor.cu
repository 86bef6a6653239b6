#include <cooperative_groups.h>

#include <iterator>
#include <stdexcept>
#include <string>

#include "kernels/common/cluster_handoff.cuh"
#include "kernels/common/common.cuh"
#include "support/launch_floor.cuh"

namespace unimoe {
namespace {

constexpr int kMaxClusterCtas = 16;  // the non-portable limit on sm_90

template <FloorSteps kSteps, bool kCluster>
__global__ void launch_floor_kernel(const float* src, int32_t* word) {
  constexpr bool kCtaHandoff = kSteps == FloorSteps::kLoadCtaHandoff;
  constexpr bool kHandoff = (kSteps == FloorSteps::kLoadHandoff || kCtaHandoff) && kCluster;
  __shared__ uint64_t bar;
  uint32_t rank = 0, others = 0;  // others: the CTAs that hand off to CTA 0
  if constexpr (kHandoff) {  // before the wait for the previous grid: nothing of it is read
    rank = cooperative_groups::this_cluster().block_rank();
    others = cooperative_groups::this_cluster().num_blocks() - 1;
    const uint32_t arrivals = kCtaHandoff ? others : others * (blockDim.x / 32);
    if (rank == 0 && threadIdx.x == 0 && others > 0) handoff_init(&bar, arrivals);
    cluster_arrive_relaxed();
  }
  pdl_begin();
  pdl_launch_dependents();
  float v = 0.0f;
  if constexpr (kSteps != FloorSteps::kEmpty) v = src[blockIdx.x * blockDim.x + threadIdx.x];
  if constexpr (kHandoff) {
    cluster_wait();  // the mbarrier is initialized
    if (rank != 0) {
      if constexpr (kCtaHandoff) {
        __syncthreads();
        if (threadIdx.x == 0) handoff_arrive_remote(&bar, 0);
      } else {
        __syncwarp();
        if (threadIdx.x % 32 == 0) handoff_arrive_remote(&bar, 0);
      }
    } else if (others > 0) {  // a cluster of one has nothing to hand off
      handoff_wait(&bar);
    }
  } else if constexpr (kSteps != FloorSteps::kEmpty && kSteps != FloorSteps::kLoad) {
    if constexpr (kCluster) cooperative_groups::this_cluster().sync();
    else __syncthreads();
  }
  if (v != 0.0f) word[1] = static_cast<int32_t>(v);
  if (blockIdx.x == 0 && threadIdx.x == 0) word[0] = static_cast<int32_t>(gridDim.x * blockDim.x);
}

template <FloorSteps kSteps, bool kCluster>
void launch_steps(int ctas, int cluster_ctas, int threads, const float* src, int32_t* word,
                  KernelStream stream) {
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
                             int32_t* word, KernelStream stream) {
  if (cluster_ctas > 0) launch_steps<kSteps, true>(ctas, cluster_ctas, threads, src, word, stream);
  else launch_steps<kSteps, false>(ctas, cluster_ctas, threads, src, word, stream);
}

// A CTA of 1,024 threads: two fill an SM (2,048 threads), so that two a SM
// reach every SM whatever the block scheduler's order.
constexpr int kEvictThreads = 1024;

// launch_icache_evict's kernels: four chains of FFMAs unrolled into about
// 8,200 instructions (the compiler keeps a loop of two passes over them),
// a different kernel for each kSeed so that their code differs.
template <int kSeed>
__global__ void __launch_bounds__(kEvictThreads) icache_evict_kernel(float* sink, float a, float b) {
  float x0 = threadIdx.x, x1 = x0 + 1.0f, x2 = x0 + 2.0f, x3 = x0 + 3.0f + kSeed;
#pragma unroll
  for (int i = 0; i < 4096; ++i) {
    x0 = x0 * a + b;
    x1 = x1 * a + b;
    x2 = x2 * a + b;
    x3 = x3 * a + b;
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3;
}

}  // namespace

int icache_evict_sink_floats(int num_sms) { return 2 * num_sms * kEvictThreads; }

void launch_icache_evict(int num_sms, float* sink, cudaStream_t stream) {
  if (num_sms < 1) throw std::invalid_argument("launch_icache_evict: num_sms must be >= 1");
  if (sink == nullptr) throw std::invalid_argument("launch_icache_evict: sink must not be null");
  icache_evict_kernel<0><<<2 * num_sms, kEvictThreads, 0, stream>>>(sink, 1.0001f, 0.5f);
  UNIMOE_CUDA_CHECK(cudaGetLastError());
  icache_evict_kernel<1><<<2 * num_sms, kEvictThreads, 0, stream>>>(sink, 1.0002f, 0.25f);
  UNIMOE_CUDA_CHECK(cudaGetLastError());
}

const char* floor_steps_name(FloorSteps steps) {
  switch (steps) {
    case FloorSteps::kEmpty: return "empty";
    case FloorSteps::kLoad: return "load";
    case FloorSteps::kLoadBarrier: return "load+barrier";
    case FloorSteps::kLoadHandoff: return "load+handoff";
    case FloorSteps::kLoadCtaHandoff: return "load+cta-handoff";
  }
  return "?";
}

void launch_floor_probe(FloorSteps steps, int ctas, int cluster_ctas, int threads, const float* src,
                        int32_t* word, KernelStream stream) {
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
  using Launch = void (*)(int, int, int, const float*, int32_t*, KernelStream);
  constexpr Launch kLaunch[] = {
      launch_clustered_or_not<FloorSteps::kEmpty>, launch_clustered_or_not<FloorSteps::kLoad>,
      launch_clustered_or_not<FloorSteps::kLoadBarrier>,
      launch_clustered_or_not<FloorSteps::kLoadHandoff>,
      launch_clustered_or_not<FloorSteps::kLoadCtaHandoff>};
  const int form = static_cast<int>(steps);
  require(form >= 0 && form < static_cast<int>(std::size(kLaunch)), "steps is not a form");
  kLaunch[form](ctas, cluster_ctas, threads, src, word, stream);
}

}  // namespace unimoe
