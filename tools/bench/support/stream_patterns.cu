// Weight-streaming access patterns (contract: stream_patterns.cuh).
#include "support/stream_patterns.cuh"

#include <stdexcept>
#include <string>

#include "kernels/common/common.cuh"
#include "kernels/gemm/warp_mma.cuh"

namespace unimoe {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowsPerWarp = 16;
constexpr int kStep = 256;  // K elements a warp requests per row in one round: 512 bytes
constexpr int kRoundBytes = kRowsPerWarp * kStep * 2;  // 8 KB a warp in flight

__device__ __forceinline__ uint4 load_stream(const uint16_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The same load with the L2 prefetch-size hint of kBlock bytes.
template <int kBlock>
__device__ __forceinline__ uint4 load_stream_hinted(const uint16_t* p) {
  uint4 v;
  if constexpr (kBlock == 128)
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  else
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t fold(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

// This warp's 16 rows and K chunk; false past the matrix.
struct WarpPiece {
  const uint16_t* row0;  // first row, at the chunk's first K
  bool valid;
};

__device__ __forceinline__ WarpPiece warp_piece(const StreamPatternArgs& a) {
  const long long warp = static_cast<long long>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int chunks = a.k / a.k_chunk;
  const long long group = warp / chunks;
  const int chunk = static_cast<int>(warp - group * chunks);
  const bool valid = group * kRowsPerWarp < a.rows;
  return {a.w + (group * kRowsPerWarp) * a.k + static_cast<long long>(chunk) * a.k_chunk, valid};
}

__device__ __forceinline__ void sink_fold(const StreamPatternArgs& a, uint32_t acc) {
  if (acc != 0) atomicXor(a.sink + blockIdx.x, acc);
}

// One round: 16 loads a lane, 8 KB a warp, all issued before any is used.
// Lane l's load j of the round reads row row_of(l, j) at K offset
// col_of(l, j) (elements) within the round's 256.
template <StreamPattern P>
__device__ __forceinline__ void round_offsets(int lane, int j, int& row, int& col) {
  if constexpr (P == StreamPattern::Rows16x64B || P == StreamPattern::Rows16x64BL2x128) {
    // As the stream kernel: lane (g, t); load j = 2u + h: row g + 8h, slab u.
    const int g = lane / 4, t = lane % 4, u = j / 2, h = j % 2;
    row = g + 8 * h;
    col = u * 32 + 8 * t;
  } else if constexpr (P == StreamPattern::Rows4x128B) {
    // Load j = 4q + c: rows 4q..4q+3, 64-element column block c.
    const int q = j / 4, c = j % 4;
    row = 4 * q + lane / 8;
    col = c * 64 + (lane % 8) * 8;
  } else {
    // Row1x512B: load j reads row j, 8 elements a lane.
    row = j;
    col = lane * 8;
  }
}

template <StreamPattern P>
__global__ void __launch_bounds__(kThreads, 2) rows_kernel(const StreamPatternArgs a) {
  const WarpPiece piece = warp_piece(a);
  if (!piece.valid) return;
  const int lane = threadIdx.x % 32;
  const uint16_t* src[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    int row, col;
    round_offsets<P>(lane, j, row, col);
    src[j] = piece.row0 + static_cast<long long>(row) * a.k + col;
  }
  uint32_t acc = 0;
  for (int k = 0; k < a.k_chunk; k += kStep) {
    uint4 v[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if constexpr (P == StreamPattern::Rows16x64BL2x128)
        v[j] = load_stream_hinted<128>(src[j] + k);
      else if constexpr (P == StreamPattern::Row1x512BL2x256)
        v[j] = load_stream_hinted<256>(src[j] + k);
      else
        v[j] = load_stream(src[j] + k);
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) acc ^= fold(v[j]);
  }
  sink_fold(a, acc);
}

// Bulk: per warp two stages of 16 rows x 512 bytes in shared memory, each
// filled by 16 one-row bulk copies completing on the stage's mbarrier.
constexpr int kBulkStages = 2;
constexpr int kBulkSmem = kWarps * kBulkStages * kRoundBytes;  // 128 KB

__device__ __forceinline__ void mbarrier_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbarrier_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// Lanes 0-15 each copy their row's 512 bytes at K offset k into `stage`.
__device__ __forceinline__ void bulk_round(const StreamPatternArgs& a, const uint16_t* row0, int k,
                                           uint32_t stage, uint32_t bar, int lane) {
  if (lane == 0) mbarrier_expect(bar, kRoundBytes);
  __syncwarp();
  if (lane < kRowsPerWarp)
    bulk_copy(stage + lane * kStep * 2, row0 + static_cast<long long>(lane) * a.k + k, kStep * 2,
              bar);
}

__global__ void __launch_bounds__(kThreads, 1) bulk_kernel(const StreamPatternArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t bars[kWarps][kBulkStages];
  const WarpPiece piece = warp_piece(a);
  if (!piece.valid) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t buf = shared_address(smem) + warp * kBulkStages * kRoundBytes;
  const uint32_t bar0 = shared_address(&bars[warp][0]);
  if (lane == 0) {
    for (int s = 0; s < kBulkStages; ++s) mbarrier_init(bar0 + 8 * s);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncwarp();
  const int rounds = a.k_chunk / kStep;
  for (int s = 0; s < kBulkStages && s < rounds; ++s)
    bulk_round(a, piece.row0, s * kStep, buf + s * kRoundBytes, bar0 + 8 * s, lane);
  uint32_t acc = 0;
  for (int r = 0; r < rounds; ++r) {
    const int s = r % kBulkStages;
    mbarrier_wait(bar0 + 8 * s, (r / kBulkStages) & 1);
    const uint4* stage = reinterpret_cast<const uint4*>(smem + (warp * kBulkStages + s) * kRoundBytes);
#pragma unroll
    for (int j = 0; j < kRoundBytes / 16 / 32; ++j) acc ^= fold(stage[j * 32 + lane]);
    // Every lane has read the stage before the async proxy refills it.
    __syncwarp();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    if (r + kBulkStages < rounds)
      bulk_round(a, piece.row0, (r + kBulkStages) * kStep, buf + s * kRoundBytes, bar0 + 8 * s,
                 lane);
  }
  sink_fold(a, acc);
}

// cp.async: a round's 16 row pieces (Row1x512B's offsets) copied 16 bytes a
// lane into this warp's 8 KB of shared memory, awaited, then read back.
constexpr int kCpAsyncSmem = kWarps * kRoundBytes;  // 64 KB

__global__ void __launch_bounds__(kThreads, 2) cp_async_kernel(const StreamPatternArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  const WarpPiece piece = warp_piece(a);
  if (!piece.valid) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint4* stage = reinterpret_cast<const uint4*>(smem + warp * kRoundBytes);
  const uint32_t base = shared_address(smem) + warp * kRoundBytes;
  uint32_t acc = 0;
  for (int k = 0; k < a.k_chunk; k += kStep) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
      cp_async_16(base + (j * 32 + lane) * 16, piece.row0 + static_cast<long long>(j) * a.k + k +
                                                   lane * 8,
                  16);
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 16; ++j) acc ^= fold(stage[j * 32 + lane]);
    __syncwarp();
  }
  sink_fold(a, acc);
}

__global__ void __launch_bounds__(kThreads, 2) linear_kernel(const StreamPatternArgs a) {
  const uint4* w = reinterpret_cast<const uint4*>(a.w);
  const long long n = a.rows * a.k / 8;
  uint32_t acc = 0;
  for (long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * kThreads)
    acc ^= fold(load_stream(reinterpret_cast<const uint16_t*>(w + i)));
  sink_fold(a, acc);
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("launch_stream_pattern: " + message);
}

}  // namespace

const char* stream_pattern_name(StreamPattern p) {
  switch (p) {
    case StreamPattern::Rows16x64B: return "rows16x64B";
    case StreamPattern::Rows4x128B: return "rows4x128B";
    case StreamPattern::Row1x512B: return "row1x512B";
    case StreamPattern::Bulk: return "bulk";
    case StreamPattern::Linear: return "linear";
    case StreamPattern::Rows16x64BL2x128: return "rows16x64B+L2::128B";
    case StreamPattern::Row1x512BL2x256: return "row1x512B+L2::256B";
    case StreamPattern::CpAsyncRow1x512B: return "cp.async row1x512B";
  }
  return "?";
}

long long stream_pattern_ctas(const StreamPatternArgs& a) {
  const long long warps = a.rows / kRowsPerWarp * (a.k / a.k_chunk);
  return (warps + kWarps - 1) / kWarps;
}

void launch_stream_pattern(StreamPattern pattern, const StreamPatternArgs& a, cudaStream_t stream) {
  require(a.w != nullptr && a.sink != nullptr, "w and sink must be set");
  require(a.rows > 0 && a.rows % kRowsPerWarp == 0, "rows must be a positive multiple of 16");
  require(a.k_chunk > 0 && a.k_chunk % kStep == 0, "k_chunk must be a positive multiple of 256");
  require(a.k > 0 && a.k % a.k_chunk == 0, "k must be a positive multiple of k_chunk");
  const long long ctas = stream_pattern_ctas(a);
  require(ctas <= 0x7fffffff, "too many CTAs");
  const unsigned grid = static_cast<unsigned>(ctas);
  switch (pattern) {
    case StreamPattern::Rows16x64B:
      rows_kernel<StreamPattern::Rows16x64B><<<grid, kThreads, 0, stream>>>(a);
      break;
    case StreamPattern::Rows4x128B:
      rows_kernel<StreamPattern::Rows4x128B><<<grid, kThreads, 0, stream>>>(a);
      break;
    case StreamPattern::Row1x512B:
      rows_kernel<StreamPattern::Row1x512B><<<grid, kThreads, 0, stream>>>(a);
      break;
    case StreamPattern::Bulk:
      UNIMOE_CUDA_CHECK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             kBulkSmem));
      bulk_kernel<<<grid, kThreads, kBulkSmem, stream>>>(a);
      break;
    case StreamPattern::Linear:
      linear_kernel<<<grid, kThreads, 0, stream>>>(a);
      break;
    case StreamPattern::Rows16x64BL2x128:
      rows_kernel<StreamPattern::Rows16x64BL2x128><<<grid, kThreads, 0, stream>>>(a);
      break;
    case StreamPattern::Row1x512BL2x256:
      rows_kernel<StreamPattern::Row1x512BL2x256><<<grid, kThreads, 0, stream>>>(a);
      break;
    case StreamPattern::CpAsyncRow1x512B:
      UNIMOE_CUDA_CHECK(cudaFuncSetAttribute(
          cp_async_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kCpAsyncSmem));
      cp_async_kernel<<<grid, kThreads, kCpAsyncSmem, stream>>>(a);
      break;
  }
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
