// Small device helpers shared by the kernel families, and the CUDA error check
// every launcher uses.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

namespace unimoe {

// Throws std::runtime_error naming the call, file and line.
#define UNIMOE_CUDA_CHECK(expr)                                                        \
  do {                                                                                 \
    const cudaError_t unimoe_err_ = (expr);                                            \
    if (unimoe_err_ != cudaSuccess)                                                    \
      throw std::runtime_error(std::string(#expr) + " failed at " + __FILE__ + ":" +   \
                               std::to_string(__LINE__) + ": " +                       \
                               cudaGetErrorString(unimoe_err_));                       \
  } while (0)

// After a launch: catches bad configurations without synchronizing.
#define UNIMOE_LAUNCH_CHECK() UNIMOE_CUDA_CHECK(cudaGetLastError())

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Inclusive sum of `value` over lanes 0..lane of a full warp (every lane
// calls it): log2(32) shuffles up. The kernels' warp scans, one form.
// (The pragma only where nvcc compiles: the host compiler of a .cpp file
// that includes this header does not know it.)
template <typename V>
__device__ __forceinline__ V warp_inclusive_sum(V value, int lane) {
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int d = 1; d < 32; d *= 2) {
    const V other = __shfl_up_sync(0xffffffffu, value, d);
    if (lane >= d) value += other;
  }
  return value;
}

// Programmatic dependent launch (PDL). The layer's kernels are launched with
// launch_pdl and call pdl_begin(), which waits until the previous grid in
// the stream has completed and its writes are visible. Nothing the previous
// grid writes is read, and nothing is written, before it, so the stream
// order holds as without PDL; only data older than the previous grid (the
// stream GEMM2's tile schedule and weights, the finalize's routing outputs:
// grouped_gemm.cuh says when; the octet routing kernel's bias, a model
// weight; the permute scatter's ids, which the grid before it waited for)
// is read before it. Kernels that trigger their
// dependents early, through pdl_launch_dependents(): the single-CTA (or
// single-cluster) routing kernels, the permute's scan kernels (E_local / 32
// CTAs, after their own wait), the stream GEMMs once their loads are
// done, and the FP8 stream path's quantize kernels in grids of at most 64
// CTAs (decode; after their own wait, fp8_quant.cuh). Every other
// dependent launches as its predecessor
// exits, which saves the launch gap.
// (Triggering at the top of every kernel was measured slower on an H200:
// mixtral-8x7b T=1 184.5 -> 206.4 us, dsv3-tp8 T=8 182.6
// -> 208.0: the dependent's CTAs took the slots its predecessor freed
// first, so they piled onto a few SMs.)
// Launched without the attribute (a graph node after a copy, or a plan
// with pdl off), the wait does nothing.
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next grid in the stream launch before this one ends; its CTAs
// then wait in pdl_begin() until this grid has completed, so the order holds.
// Only for small grids (one CTA or cluster, or a few dozen CTAs), which
// leave most SMs free for the dependent's CTAs: what is saved is the
// dependent's launch latency, and a stream GEMM's first weight loads.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The next GEMM's weights, fetched into L2 while this one streams its own
// (decode, where both GEMMs read few experts): expert e's bytes are
// [base + e * bytes, + bytes) and, where set, [base2 + e * bytes2, + bytes2)
// (its scales). A kernel given one issues the prefetch only when the call
// has at most max_tiles tiles, so that the experts' bytes stay within the
// share of L2 its launcher chose; the prefetch is a hint and never changes
// what is computed. base == nullptr: none.
struct NextWeightsPrefetch {
  const void* base = nullptr;
  std::size_t bytes = 0;
  const void* base2 = nullptr;
  std::size_t bytes2 = 0;
  int max_tiles = 0;
};

// Asks L2 for [p, p + bytes): the TMA unit fetches it, no thread waits.
__device__ __forceinline__ void l2_prefetch_bulk(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

// Part `part` of `parts` of [base + index * bytes, + bytes), cut on 16-byte
// boundaries inside the range (the bulk prefetch's alignment; the range's
// unaligned ends are left out).
__device__ __forceinline__ void l2_prefetch_part(const void* base, std::size_t bytes, int index,
                                                 int part, int parts) {
  if (base == nullptr || bytes == 0) return;
  const std::size_t begin = reinterpret_cast<std::size_t>(base) + static_cast<std::size_t>(index) * bytes;
  const std::size_t first = (begin + 15) / 16 * 16, last = (begin + bytes) / 16 * 16;
  if (last <= first) return;
  const std::size_t slice = ((last - first) / parts + 15) / 16 * 16 + 16;
  const std::size_t lo = first + static_cast<std::size_t>(part) * slice;
  if (lo >= last) return;
  const std::size_t hi = lo + slice < last ? lo + slice : last;
  l2_prefetch_bulk(reinterpret_cast<const void*>(lo), static_cast<unsigned>(hi - lo));
}

// One CTA's share (part of parts) of expert `expert`'s next weights; call
// from one thread per range (thread 0 the weights, another the scales).
__device__ __forceinline__ void prefetch_next_weights(const NextWeightsPrefetch& f, int num_tiles,
                                                      int expert, int part, int parts,
                                                      bool scales) {
  if (f.base == nullptr || num_tiles > f.max_tiles) return;
  if (scales)
    l2_prefetch_part(f.base2, f.bytes2, expert, part, parts);
  else
    l2_prefetch_part(f.base, f.bytes, expert, part, parts);
}

// Where a launcher puts its kernels: the stream, and whether they are
// launched with programmatic dependent launch (the plans' `pdl`, off only
// for measuring what PDL gains). A plain cudaStream_t converts to it with
// PDL on, so tests pass their stream as it is.
struct KernelStream {
  KernelStream(cudaStream_t s) : stream(s) {}  // NOLINT: implicit on purpose
  KernelStream(cudaStream_t s, bool with_pdl) : stream(s), pdl(with_pdl) {}
  cudaStream_t stream;
  bool pdl = true;
};

// The current device's SM count.
int current_device_sm_count();

// The current device's L2 size in bytes.
int current_device_l2_bytes();

// How many experts' next weights (expert_bytes each) a GEMM may prefetch
// into L2 (NextWeightsPrefetch::max_tiles): two fifths of the device's L2,
// so that the current GEMM's own stream and the prefetched bytes both fit.
int next_weights_max_tiles(std::size_t expert_bytes);

// As launch_pdl, with the grid launched as thread-block clusters of
// `cluster_ctas` CTAs along x when cluster_ctas > 0.
template <typename... Params, typename... Args>
void launch_pdl_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem_bytes,
                          int cluster_ctas, KernelStream stream, Args&&... args) {
  cudaLaunchAttribute attribute[2];
  unsigned count = 0;
  if (stream.pdl) {
    attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_ctas > 0) {
    attribute[count].id = cudaLaunchAttributeClusterDimension;
    attribute[count].val.clusterDim.x = cluster_ctas;
    attribute[count].val.clusterDim.y = 1;
    attribute[count++].val.clusterDim.z = 1;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream.stream;
  config.attrs = attribute;
  config.numAttrs = count;
  UNIMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem_bytes,
                KernelStream stream, Args&&... args) {
  launch_pdl_clustered(kernel, grid, block, smem_bytes, 0, stream, std::forward<Args>(args)...);
}

}  // namespace unimoe
