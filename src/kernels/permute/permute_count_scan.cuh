// The permute chain's count and scan kernels: rows per (chunk, expert), then
// per-chunk base rows and expert totals (permute_count_kernel,
// permute_scan_kernel, permute_scan_table_kernel, permute_count_scan_kernel).
// Internal to permute.cu, which alone includes it (anonymous namespace).
#pragma once

#include <cstdint>

#include "kernels/common/common.cuh"
#include "kernels/permute/permute_layout.cuh"

namespace unimoe {
namespace {

// A chunk's rows a thread: kMaxChunkRows / kCountThreads at most, loaded into
// registers before any is counted. (A loop that loaded and counted each row
// in turn kept one load in flight a thread: the ids come through a generic
// pointer that may alias the shared counters, so no load moved above the
// previous row's atomic. ncu: four load round trips in a row, the kernel's
// main stall.)
constexpr int kCountRowsPerThread = kMaxChunkRows / kCountThreads;
static_assert(kMaxChunkRows % kCountThreads == 0, "a chunk is whole rows for every count thread");

// counts[chunk][e]: rows of the chunk routed to local expert e.
__global__ void __launch_bounds__(kCountThreads)
    permute_count_kernel(const int32_t* topk_ids, int rows, int chunk_rows, int local_offset,
                         int num_local, int32_t* chunk_counts) {
  pdl_begin();
  __shared__ int s_count[kMaxLocalExperts];
  const int begin = blockIdx.x * chunk_rows;
  const int end = min(begin + chunk_rows, rows);
  int expert[kCountRowsPerThread];
#pragma unroll
  for (int u = 0; u < kCountRowsPerThread; ++u)
    expert[u] = local_expert(topk_ids, begin + threadIdx.x + u * kCountThreads, end, local_offset,
                             num_local);
  for (int e = threadIdx.x; e < num_local; e += blockDim.x) s_count[e] = 0;
  __syncthreads();
#pragma unroll
  for (int u = 0; u < kCountRowsPerThread; ++u)
    if (expert[u] >= 0) atomicAdd(&s_count[expert[u]], 1);
  __syncthreads();

  int32_t* out = chunk_counts + static_cast<size_t>(blockIdx.x) * num_local;
  for (int e = threadIdx.x; e < num_local; e += blockDim.x) out[e] = s_count[e];
}

// ----------------------------------------------------------------- scan ----
// The scan kernels (E_local / 32 CTAs, most SMs idle) let the scatter
// launch as soon as their own wait is over, so that its CTAs start on the
// idle SMs and load their chunk's ids while the scan runs; the scatter
// waits for the scan's totals and bases. kTrigger: where
// permute_shape::scan_triggers_scatter says (every scatter CTA finds a
// free SM), as the routing plan says (scan_triggers_scatter; off with the
// development override permute_trigger=0, for A/B timing).
template <bool kTrigger>
__device__ __forceinline__ void scan_triggers_scatter() {
  if constexpr (kTrigger) pdl_launch_dependents();
}

// Exclusive scan of one value per thread over the whole block; returns the
// block total too. `s_warp` holds kWarpSize + 1 values.
template <typename V>
__device__ V block_exclusive_scan(V value, V* total, V* s_warp) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  V inclusive = warp_inclusive_sum(value, lane);
  if (lane == kWarpSize - 1) s_warp[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const V w = lane < num_warps ? s_warp[lane] : V(0);
    V w_inclusive = warp_inclusive_sum(w, lane);
    if (lane < num_warps) s_warp[lane] = w_inclusive - w;  // exclusive warp base
    if (lane == kWarpSize - 1) s_warp[kWarpSize] = w_inclusive;
  }
  __syncthreads();
  const V result = s_warp[warp] + inclusive - value;
  *total = s_warp[kWarpSize];
  __syncthreads();  // s_warp may be reused by the next call
  return result;
}

// The scan over chunks of 32 experts' counts, for the block that owns
// local experts 32b .. 32b + 31 (lane = expert): warp w owns the w-th span of
// ceil(num_chunks / 32) chunks. Pass 1 sums each (span, expert); the spans'
// sums are scanned in shared memory; pass 2 rewrites the counts as rows of
// earlier chunks (count(c) reads chunk c's count of this lane's expert,
// set_base(c, n) writes its base), and the block writes its experts' totals.
// A thread keeps its first kScanBatch counts in registers for pass 2 (every
// chunk up to 256 chunks). Every thread of the block calls this.
template <typename Count, typename SetBase>
__device__ void scan_chunk_columns(int num_chunks, int num_local, Count count, SetBase set_base,
                                   int32_t* totals) {
  __shared__ int s_part[kScanWarps][kWarpSize + 1];  // per (span, expert): sum, then base
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const bool owns = static_cast<int>(blockIdx.x) * kWarpSize + lane < num_local;
  const int span = (num_chunks + kScanWarps - 1) / kScanWarps;
  const int begin = min(warp * span, num_chunks), end = min(begin + span, num_chunks);

  int kept[kScanBatch];
  int sum = 0;
#pragma unroll
  for (int u = 0; u < kScanBatch; ++u) {
    kept[u] = owns && begin + u < end ? count(begin + u) : 0;
    sum += kept[u];
  }
  for (int c = begin + kScanBatch; c < end; ++c)
    if (owns) sum += count(c);
  s_part[warp][lane] = sum;
  __syncthreads();

  // Warp w scans expert 32b + w over the spans (lane = span).
  {
    const int part = s_part[lane][warp];
    int inclusive = warp_inclusive_sum(part, lane);
    s_part[lane][warp] = inclusive - part;
    const int expert = blockIdx.x * kWarpSize + warp;
    if (lane == kWarpSize - 1 && expert < num_local) totals[expert] = inclusive;
  }
  __syncthreads();

  int next = s_part[warp][lane];
#pragma unroll
  for (int u = 0; u < kScanBatch; ++u) {
    if (owns && begin + u < end) set_base(begin + u, next);
    next += kept[u];
  }
  for (int c = begin + kScanBatch; c < end; ++c) {
    if (!owns) break;
    const int n = count(c);
    set_base(c, next);
    next += n;
  }
}

// After permute_count_kernel: the counts in global memory become bases in
// place.
template <bool kTrigger>
__global__ void __launch_bounds__(kScanThreads)
    permute_scan_kernel(int num_chunks, int num_local, int32_t* chunk_counts, int32_t* totals) {
  pdl_begin();
  scan_triggers_scatter<kTrigger>();
  int32_t* column = chunk_counts + blockIdx.x * kWarpSize + threadIdx.x % kWarpSize;
  scan_chunk_columns(
      num_chunks, num_local,
      [column, num_local](int c) { return column[static_cast<size_t>(c) * num_local]; },
      [column, num_local](int c, int n) { column[static_cast<size_t>(c) * num_local] = n; },
      totals);
}

// The same after a routing kernel counted the rows (launch_permute's
// `counted`): chunk c's count of expert e is the sum of the low `blocks`
// bytes of table[c][e] (each at most 16, their sum below 256, so one
// multiply adds four bytes into the top one).
__device__ __forceinline__ int byte_sum(uint64_t word, uint64_t mask) {
  word &= mask;
  const uint32_t lo = static_cast<uint32_t>(word), hi = static_cast<uint32_t>(word >> 32);
  return static_cast<int>((lo * 0x01010101u) >> 24) + static_cast<int>((hi * 0x01010101u) >> 24);
}

template <bool kTrigger>
__global__ void __launch_bounds__(kScanThreads)
    permute_scan_table_kernel(int num_chunks, int num_local, int blocks, const uint64_t* table,
                              int32_t* chunk_counts, int32_t* totals) {
  pdl_begin();
  scan_triggers_scatter<kTrigger>();
  const int column_index = blockIdx.x * kWarpSize + threadIdx.x % kWarpSize;
  const uint64_t* words = table + column_index;
  int32_t* column = chunk_counts + column_index;
  const uint64_t mask = blocks >= 8 ? ~uint64_t(0) : (uint64_t(1) << (8 * blocks)) - 1;
  scan_chunk_columns(
      num_chunks, num_local,
      [words, num_local, mask](int c) {
        return byte_sum(words[static_cast<size_t>(c) * num_local], mask);
      },
      [column, num_local](int c, int n) { column[static_cast<size_t>(c) * num_local] = n; },
      totals);
}

// Calls of at most kCountScanRows expanded rows: count and scan in one
// launch. The block that owns 32 experts reads every expanded row, counts its
// experts' rows per chunk in shared memory, and scans them; the bases go to
// global memory. One launch fewer where the chain's fixed cost weighs most.
// Measured on an H200 (split chain, K = 8, E = 128 and 256): 0.4 to 0.7 us
// faster up to T = 256 (2048 rows), but 1.0-1.1 us slower at T = 1024 (8192
// rows), where E / 32 blocks read all the ids while the count kernel spreads
// them over 32 blocks.
constexpr int kCountScanRows = permute_chunks::kCountScanRows;
constexpr int kSmallChunks = kCountScanRows / kSmallChunkRows;
static_assert(kCountScanRows <= kSmallRows && kCountScanRows % kSmallChunkRows == 0,
              "count + scan calls cut whole small chunks");

template <bool kTrigger>
__global__ void __launch_bounds__(kScanThreads)
    permute_count_scan_kernel(const int32_t* topk_ids, int rows, int num_chunks, int local_offset,
                              int num_local, int32_t* chunk_counts, int32_t* totals) {
  pdl_begin();
  scan_triggers_scatter<kTrigger>();
  __shared__ int s_count[kSmallChunks][kWarpSize];
  for (int i = threadIdx.x; i < kSmallChunks * kWarpSize; i += blockDim.x)
    s_count[i / kWarpSize][i % kWarpSize] = 0;
  __syncthreads();
  const int first = blockIdx.x * kWarpSize;
#pragma unroll 4
  for (int row = threadIdx.x; row < rows; row += blockDim.x) {
    const int e = local_expert(topk_ids, row, rows, local_offset, num_local) - first;
    if (e >= 0 && e < kWarpSize) atomicAdd(&s_count[row / kSmallChunkRows][e], 1);
  }
  __syncthreads();
  const int lane = threadIdx.x % kWarpSize;
  int32_t* column = chunk_counts + first + lane;
  const int* my_counts = &s_count[0][lane];
  scan_chunk_columns(
      num_chunks, num_local, [my_counts](int c) { return my_counts[c * kWarpSize]; },
      [column, num_local](int c, int n) { column[static_cast<size_t>(c) * num_local] = n; },
      totals);
}

}  // namespace
}  // namespace unimoe
