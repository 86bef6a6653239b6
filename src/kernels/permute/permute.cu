// Sort/permute: topk_ids -> expert counts and offsets, the two row maps and
// the tile schedules (contract: permute.cuh). Fixed launches for a given T
// (three, or two up to kCountScanRows expanded rows), so the chain captures once
// in a CUDA graph:
//   1. count:   each block counts one chunk of expanded rows per expert
//               (left out where the octet routing kernel counted them:
//               `counted`, PermuteCounts; the scan then sums its table);
//   2. scan:    each block takes 32 experts and turns their counts into
//               per-chunk base rows (a scan over the chunks) and totals;
//               up to kCountScanRows rows, one kernel does 1 and 2 (each
//               block reads every row and counts its 32 experts);
//   3. scatter: each block scans the totals into expert offsets and tile
//               bases itself (block 0 writes them out), re-reads its chunk
//               and places every row at its stable rank (rows of an expert
//               in increasing expanded index), and writes its share of the
//               tile schedules.
// Measured on the H200 (session 9 run 1, ncu, T = 16384, K = 8, E = 256):
// a one-block scan of the 128 x 256 counts took 11.5 us of the chain's 23,
// the count kernel 3.2 and the scatter 8.3. Session 15 (runs 1-3, ncu, the
// kernels serialized, DeepSeekV3 E=256 K=8 T=16384): count 2.7, scan 3.0,
// scatter 9.0 -> 7.4 once each kernel's loads are all in flight at once,
// one vote a piece instead of two, and one scan for the offsets and the
// first tile schedule.
// Session 23 (globaltimer and clock64 stamps, a one-off build, DeepSeekV3
// E=256 K=8 T=16384): the scatter took 5.4 us, 2,770 cycles of them in the
// votes of pass 1; the calls the octet kernel counted now rank by token
// masks before the scatter's wait (permute_scatter_kernel<true>).
// Expanded rows are split into chunks of whole warp pieces, and each chunk
// into one contiguous span per warp, so that ranks come from warp votes (or
// token masks) and per-warp counters in shared memory: no global atomics,
// the same result on every run.
#include <algorithm>

#include "core/exact_quotient.h"
#include "core/permute_launch_shape.h"
#include "core/routing_launch_shape.h"
#include "kernels/common/common.cuh"
#include "kernels/permute/permute.cuh"

namespace unimoe {
namespace {

constexpr int kMaxLocalExperts = 1024;
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kCountThreads = 256;
constexpr int kScatterWarps = 8;
constexpr int kScatterThreads = kScatterWarps * kWarpSize;
constexpr int kScanWarps = 32;  // a scan block: 32 experts (a lane each) x 32 spans of chunks
constexpr int kScanThreads = kScanWarps * kWarpSize;
constexpr int kScanBatch = 8;  // chunks a scan thread loads at once
constexpr int kExpertsPerScatterThread = kMaxLocalExperts / kScatterThreads;
// Chunk sizes: enough chunks to fill the GPU (about kTargetChunks), each
// within [kMinChunkRows, kMaxChunkRows] so that the scatter kernel can stage a
// chunk's experts in shared memory. Up to kSmallRows expanded rows the
// chunks are kSmallChunkRows long (at most 64 chunks). Measured on the H200
// (session 7 run 6, one call, the layer's permute stage, 256-row chunks
// against 1024): 4096 rows (T=512, K=8) 10.2 -> 7.4 us on qwen3-30b-a3b,
// 11.4 -> 8.5 on dsv3-tp8; 8192 rows (mixtral-8x7b T=4096) 10.4 -> 7.7;
// 16384 rows (gpt-oss-120b T=4096) 13.7 -> 12.5. At 32768 rows (T=4096,
// K=8) 128 chunks of 256 lost, 12.9 -> 15.9 on qwen3-30b-a3b: the scan's
// share grows with chunks x experts. Session 18 (runs 10-12, the split
// chain at K = 4, 8, E 128..384, against 1024-row chunks): a 512-row
// minimum, so that 20480 to 98304 rows cut 40 to 128 chunks instead of 20
// to 96, 0.956 (geometric mean over 60 points; 0.90-0.96 at 24576-65536
// rows, e.g. DeepSeekV3 E=256 K=8 T=4096 14.55 -> 13.74 us), none slower
// than 1.006; but more than about 128 chunks lost again (256 chunks of 512
// rows at T*K = 131072 1.01-1.04, 86 of 1536 1.02-1.06).
constexpr int kSmallRows = 16384;
constexpr int kSmallChunkRows = 256;
constexpr int kMinChunkRows = 512;
constexpr int kMaxChunkRows = 4096;
constexpr int kTargetChunks = 128;

static_assert(kSmallChunkRows % kScatterThreads == 0, "a chunk is whole pieces for every warp");
static_assert(kMinChunkRows % kScatterThreads == 0, "a chunk is whole pieces for every warp");
static_assert(kMaxChunkRows % kScatterThreads == 0, "a chunk is whole pieces for every warp");
static_assert(kMaxLocalExperts % kScatterThreads == 0, "a scatter thread owns whole experts");
static_assert(kMaxChunkRows / kScatterWarps <= 32767, "a warp's rows of one expert fit int16");
static_assert(kMaxLocalExperts <= 32767, "staged experts are int16");

// How the expanded rows are cut into chunks, and where things lie in the
// scratch; the same for the scratch size and the launch.
struct Layout {
  int rows = 0;        // T * K
  int chunk_rows = 0;  // a multiple of kScatterThreads
  int num_chunks = 0;
  // Scratch, in int32: expert totals [E_local], chunk counts
  // [num_chunks][E_local], then (8-byte aligned) the routing kernel's byte
  // table [num_chunks][E_local] of uint64 (PermuteCounts).
  std::size_t totals = 0;
  std::size_t chunk_counts = 0;
  std::size_t table = 0;
  std::size_t total = 0;
};

int chunk_rows_for(int rows) {
  const int wanted = rows <= kSmallRows
                         ? kSmallChunkRows
                         : std::clamp(ceil_div(rows, kTargetChunks), kMinChunkRows, kMaxChunkRows);
  return ceil_div(wanted, kScatterThreads) * kScatterThreads;
}

Layout layout(int num_tokens, int top_k, int num_local) {
  Layout l;
  l.rows = num_tokens * top_k;
  l.chunk_rows = chunk_rows_for(l.rows);
  l.num_chunks = ceil_div(l.rows, l.chunk_rows);
  l.totals = 0;
  l.chunk_counts = static_cast<std::size_t>(num_local);
  const std::size_t cells = static_cast<std::size_t>(l.num_chunks) * num_local;
  l.table = (l.chunk_counts + cells + 1) / 2 * 2;
  l.total = l.table + 2 * cells;
  return l;
}

// The most chunks any call of at most `rows` expanded rows cuts: the chunk
// count is not monotone in the rows (it drops where the chunks grow, past
// kSmallRows and past kTargetChunks * kMinChunkRows), and a workspace sized
// for a layer's largest T must hold every smaller call's counts.
int max_chunks(int rows) {
  int most = ceil_div(rows, chunk_rows_for(rows));
  for (int edge : {kSmallRows, kTargetChunks * kMinChunkRows})
    if (rows > edge) most = std::max(most, ceil_div(edge, chunk_rows_for(edge)));
  return most;
}

// Local expert of an expanded row, or -1 when it is routed off this rank.
__device__ __forceinline__ int local_expert(const int32_t* topk_ids, int row, int rows,
                                            int local_offset, int num_local) {
  if (row >= rows) return -1;
  const int e = topk_ids[row] - local_offset;
  return (e >= 0 && e < num_local) ? e : -1;
}

// ---------------------------------------------------------------- count ----
// A chunk's rows a thread: kMaxChunkRows / kCountThreads at most, loaded into
// registers before any is counted. (A loop that loaded and counted each row
// in turn kept one load in flight a thread: the ids come through a generic
// pointer that may alias the shared counters, so no load moved above the
// previous row's atomic. Session 15 run 1, ncu: four load round trips in a
// row, the kernel's main stall.)
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
// free SM), unless UNIMOE_PERMUTE_TRIGGER is "0" (read once; for A/B
// timing).
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
// launch. The block that owns 32 experts reads every expanded row, counts
// its experts' rows per chunk in shared memory, and scans them; the bases go
// to global memory. One launch fewer where the chain's fixed cost weighs
// most. Measured (session 9 run 3, split chain, K = 8, E = 128 and 256): 0.4
// to 0.7 us faster up to T = 256 (2048 rows), but 1.0-1.1 us slower at T =
// 1024 (8192 rows), where E / 32 blocks read all the ids while the count
// kernel spreads them over 32 blocks.
constexpr int kCountScanRows = 2048;
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

// -------------------------------------------------------------- scatter ----
struct ScatterParams {
  const int32_t* topk_ids;
  int rows;
  int chunk_rows;
  int num_chunks;
  int local_offset;
  int num_local;
  const int32_t* chunk_base;  // [num_chunks][E_local] rows of earlier chunks
  const int32_t* totals;      // [E_local] rows of each expert
  int32_t* expert_counts;     // written by block 0
  int32_t* expert_offsets;    // written by block 0
  int32_t* permuted_to_expanded;
  int32_t* expanded_to_permuted;
  int num_tile_sizes;
  int tile_m[kMaxTileSizes];
  DeviceTile* tiles[kMaxTileSizes];
  int32_t* num_tiles[kMaxTileSizes];  // written by block 0
  float inv_top_k;                    // inverse_of(K), for the token masks (kMasks)
};

// Exclusive scan of value(e) over e < n: emit(e, the sum of value over
// the experts below e) for e < n, and emit(n, the total). Every thread of
// the block calls this, and a __syncthreads() must follow before what emit
// wrote is read.
template <typename V, typename Value, typename Emit>
__device__ void scan_experts(int n, Value value, Emit emit, V* s_warp) {
  const int first = threadIdx.x * kExpertsPerScatterThread;
  V v[kExpertsPerScatterThread];
  V sum = 0;
#pragma unroll
  for (int u = 0; u < kExpertsPerScatterThread; ++u) {
    v[u] = first + u < n ? value(first + u) : V(0);
    sum += v[u];
  }
  V total = 0;
  V next = block_exclusive_scan(sum, &total, s_warp);
#pragma unroll
  for (int u = 0; u < kExpertsPerScatterThread; ++u) {
    if (first + u < n) emit(first + u, next);
    next += v[u];
  }
  if (threadIdx.x == 0) emit(n, total);
}

// The tiles of `count` rows, tile_m rows a tile.
__device__ __forceinline__ int tiles_of(int count, int tile_m) { return (count + tile_m - 1) / tile_m; }

// Tile i of every schedule, spread over the whole grid so that one hot
// expert's many tiles do not serialize: tile i belongs to the last expert
// whose first tile is <= i (empty experts share their successor's base).
// The first schedule's bases come in s_bases (from the offsets' scan); each
// further one is scanned into s_bases here, for the binary search. Every
// thread of the block calls this, after a barrier.
__device__ void write_tiles(const ScatterParams& p, const int* s_offset, int* s_bases,
                            uint64_t* s_warp) {
  const int stride = gridDim.x * blockDim.x;
#pragma unroll 1
  for (int s = 0; s < kMaxTileSizes; ++s) {
    if (s >= p.num_tile_sizes) break;
    const int tile_m = p.tile_m[s];
    if (s > 0) {
      __syncthreads();  // the previous schedule's searches are done with s_bases
      scan_experts<uint64_t>(
          p.num_local,
          [s_offset, tile_m](int e) { return uint64_t(tiles_of(s_offset[e + 1] - s_offset[e], tile_m)); },
          [s_bases](int e, uint64_t v) { s_bases[e] = static_cast<int>(v); }, s_warp);
      __syncthreads();
    }
    const int num_tiles = s_bases[p.num_local];
    if (blockIdx.x == 0 && threadIdx.x == 0) *p.num_tiles[s] = num_tiles;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < num_tiles; i += stride) {
      int lo = 0, hi = p.num_local - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (s_bases[mid] <= i) lo = mid; else hi = mid - 1;
      }
      const int row_start = s_offset[lo] + (i - s_bases[lo]) * tile_m;
      const int rows = min(tile_m, s_offset[lo + 1] - row_start);
      p.tiles[s][i] = DeviceTile{lo, row_start, rows, 0};
    }
  }
}

// The chunk's local experts are staged in shared memory first (every load
// in flight before the first is used), with the experts' totals and this
// chunk's base rows; the totals are scanned into expert offsets. Warp w then
// handles the w-th contiguous span of the chunk, 32 rows a piece, in order:
// pass 1 ranks each row among its warp's earlier rows of the same expert (a
// per-warp counter a expert, and the rank among the piece's lanes of that
// expert, from one __match_any_sync), and packs the rank beside the expert;
// a scan over warps turns the counters into each warp's first row within
// the chunk's rows of that expert; pass 2 places each row at the chunk's
// first row of its expert plus its warp's base plus its rank: no vote and
// no order between the rows. A block past the rows (T = 0 launches one)
// writes only its share of the offsets and schedules.
// Session 15 run 1 (ncu, T=16384, the former kernel): the ids loaded one
// round trip at a time (a loop that stored each to shared memory before
// the next load), and each piece's vote stalled its warp twice (a vote in
// each pass, each after the previous piece's counter update).
constexpr int kScatterRowsPerThread = kMaxChunkRows / kScatterThreads;
constexpr int kPiecesAtOnce = 4;  // votes a warp issues before it waits on the first

__device__ __forceinline__ int packed_row(int e, int rank) { return rank << 16 | (e & 0xffff); }
__device__ __forceinline__ int packed_expert(int packed) { return static_cast<int16_t>(packed & 0xffff); }
__device__ __forceinline__ int packed_rank(int packed) { return packed >> 16; }
static_assert(kMaxChunkRows / kScatterWarps < (1 << 15), "a rank packs into the upper 16 bits");

// This lane's entries of kPiecesAtOnce pieces from `piece` on (-1 from
// span_end on).
__device__ __forceinline__ void load_pieces(const int32_t* s_row, int piece, int span_end, int lane,
                                            int (&out)[kPiecesAtOnce]) {
#pragma unroll
  for (int j = 0; j < kPiecesAtOnce; ++j) {
    const int i = piece + j * kWarpSize + lane;
    out[j] = i < span_end ? s_row[i] : -1;
  }
}

// f(i, entry) for each of this lane's entries i of the span, kPiecesAtOnce
// pieces loaded before any is handed on (entry -1 from span_end on).
template <typename F>
__device__ __forceinline__ void for_span_entries(const int32_t* s_row, int span_begin, int span_end,
                                                 int lane, F f) {
  for (int piece = span_begin; piece < span_end; piece += kPiecesAtOnce * kWarpSize) {
    int entry[kPiecesAtOnce];
    load_pieces(s_row, piece, span_end, lane, entry);
#pragma unroll
    for (int j = 0; j < kPiecesAtOnce; ++j) f(piece + j * kWarpSize + lane, entry[j]);
  }
}

// The chunk's experts into s_row, and every warp's counters (or masks)
// zeroed. Every thread calls it; a barrier must follow.
__device__ __forceinline__ void stage_rows(const ScatterParams& p,
                                           const int (&expert)[kScatterRowsPerThread],
                                           int32_t* s_row,
                                           int16_t (*s_cursor)[kMaxLocalExperts]) {
#pragma unroll
  for (int u = 0; u < kScatterRowsPerThread; ++u) {
    const int i = threadIdx.x + u * kScatterThreads;
    if (i < p.chunk_rows) s_row[i] = expert[u];
  }
#pragma unroll
  for (int w = 0; w < kScatterWarps; ++w)
    for (int e = threadIdx.x; e < p.num_local; e += kScatterThreads) s_cursor[w][e] = 0;
}

// Pass 1 by token masks (permute_scatter_kernel<true>): this warp's span
// sets its masks, then packs each row's rank beside its expert. A counted
// chunk is n <= kOctetCountMaxBlocks octet blocks of kOctetTokensPerBlock
// tokens, so a warp's span is 16 * n / kScatterWarps whole tokens: at most
// 16, one bit each in an expert's 16-bit mask.
static_assert(routing_shape::kOctetTokensPerBlock % kScatterWarps == 0,
              "a warp's span of a counted chunk is whole tokens");
static_assert(routing_shape::kOctetTokensPerBlock * routing_shape::kOctetCountMaxBlocks /
                      kScatterWarps <=
                  16,
              "a span's tokens fit an expert's 16-bit mask");
__device__ __forceinline__ void rank_by_masks(const ScatterParams& p, int32_t* s_row,
                                              int16_t (*s_cursor)[kMaxLocalExperts],
                                              int span_begin, int span_end, int lane, int warp) {
  uint32_t* masks = reinterpret_cast<uint32_t*>(s_cursor[warp]);  // two experts a word
  for_span_entries(s_row, span_begin, span_end, lane, [&](int i, int e) {
    const int token = exact_quotient(i - span_begin, p.inv_top_k);
    if (e >= 0) atomicOr(&masks[e >> 1], 1u << ((e & 1) * 16 + token));
  });
  __syncwarp();  // the span's masks are whole
  for_span_entries(s_row, span_begin, span_end, lane, [&](int i, int e) {
    const int token = exact_quotient(i - span_begin, p.inv_top_k);
    const unsigned mask = e >= 0 ? static_cast<uint16_t>(s_cursor[warp][e]) : 0u;
    if (i < span_end) s_row[i] = packed_row(e, __popc(mask & ((1u << token) - 1u)));
  });
}

// Each warp's counts (kMasks: the masks' popcounts) -> its first row within
// the chunk's rows of each expert, in place. Every thread calls it, after
// a barrier; another must follow before the bases are read.
template <bool kMasks>
__device__ __forceinline__ void warp_bases(const ScatterParams& p,
                                           int16_t (*s_cursor)[kMaxLocalExperts]) {
  for (int e = threadIdx.x; e < p.num_local; e += blockDim.x) {
    int next = 0;
#pragma unroll
    for (int w = 0; w < kScatterWarps; ++w) {
      const int n = kMasks ? __popc(static_cast<uint16_t>(s_cursor[w][e])) : s_cursor[w][e];
      s_cursor[w][e] = static_cast<int16_t>(next);
      next += n;
    }
  }
}

// kMasks (the calls the octet kernel counted, launch_permute's `counted`:
// a token's K experts are distinct, and a warp's span is 2 to 16 whole
// tokens, 2 * K rows a block of its chunk, octet_count_blocks): pass 1
// ranks the rows by token masks instead of votes. Bit t of s_cursor[w][e],
// read as 16 bits, says that token t of warp w's span has a row at e (an
// atomicOr on the 32-bit word of two experts' masks); a row's rank is the
// popcount of the bits below its token's, and the warp's count of e the
// popcount of the mask. With nothing but the ids to read, pass 1 and the
// warp bases run before the wait, and the scan triggers this kernel even
// where its CTAs do not all find a free SM (scan_triggers_scatter).
// Measured (H200, DeepSeekV3/MiniMax2 E 128..384, K 4 and 8, T 2048..16384,
// against the votes in the same build): session 23 run 3, the masks after
// the wait, 0.97-0.98x at T=16384 K=8 (DeepSeekV3 E=256 21.34 -> 20.86 us);
// run 4, before it and triggered, 0.957 by geometric mean over 72 points,
// 0.88-0.96 at T = 4096-16384 (DeepSeekV3 E=256 K=8 T=4096 13.96 -> 12.59,
// T=16384 22.24 -> 20.70).
template <bool kMasks>
__global__ void __launch_bounds__(kScatterThreads) permute_scatter_kernel(ScatterParams p) {
  // Counts (kMasks: masks), then warp bases.
  __shared__ alignas(4) int16_t s_cursor[kScatterWarps][kMaxLocalExperts];
  __shared__ int32_t s_row[kMaxChunkRows];      // expert (-1: off rank or past the end), then rank
  __shared__ int s_offset[kMaxLocalExperts + 1];
  __shared__ int s_first[kMaxLocalExperts];     // the chunk's first row of each expert
  __shared__ int s_bases[kMaxLocalExperts + 1];  // the totals, then one tile schedule's bases
  __shared__ uint64_t s_warp[kWarpSize + 1];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const unsigned lanes_below = (1u << lane) - 1u;
  const int chunk_begin = blockIdx.x * p.chunk_rows;
  const int chunk_end = min(chunk_begin + p.chunk_rows, p.rows);
  const int span = p.chunk_rows / kScatterWarps;
  const bool has_rows = blockIdx.x < p.num_chunks;

  // Loads first, all in flight: the chunk's experts, the totals, the bases.
  // The experts before the wait (with kMasks, the whole pass 1): the scan
  // before this kernel triggers it once its own wait is over
  // (scan_triggers_scatter), so the ids' writer, a grid before the scan's
  // predecessor or that predecessor itself, is complete when this block
  // starts; the totals and bases are the scan's.
  int expert[kScatterRowsPerThread];
#pragma unroll
  for (int u = 0; u < kScatterRowsPerThread; ++u)
    expert[u] = local_expert(p.topk_ids, chunk_begin + threadIdx.x + u * kScatterThreads, chunk_end,
                             p.local_offset, p.num_local);
  if constexpr (kMasks) {
    // Pass 1 and the warp bases need only the ids: before the wait, so that
    // where the scan triggers this kernel they overlap it.
    stage_rows(p, expert, s_row, s_cursor);
    __syncthreads();
    if (has_rows) rank_by_masks(p, s_row, s_cursor, warp * span, (warp + 1) * span, lane, warp);
    __syncthreads();
    warp_bases<true>(p, s_cursor);
  }
  pdl_begin();
  int base[kExpertsPerScatterThread], total[kExpertsPerScatterThread];
#pragma unroll
  for (int u = 0; u < kExpertsPerScatterThread; ++u) {
    const int e = threadIdx.x + u * kScatterThreads;
    base[u] = has_rows && e < p.num_local
                  ? p.chunk_base[static_cast<size_t>(blockIdx.x) * p.num_local + e] : 0;
    total[u] = e < p.num_local ? p.totals[e] : 0;
  }
#pragma unroll
  for (int u = 0; u < kExpertsPerScatterThread; ++u) {
    const int e = threadIdx.x + u * kScatterThreads;
    if (e < p.num_local) s_bases[e] = total[u];
  }
  if constexpr (!kMasks) stage_rows(p, expert, s_row, s_cursor);
  __syncthreads();

  // Offsets and the first schedule's tile bases in one scan: rows in the
  // low 32 bits, tiles in the high (each total below 2^31).
  {
    const int tile_m = p.num_tile_sizes > 0 ? p.tile_m[0] : 1;
    scan_experts<uint64_t>(
        p.num_local,
        [&](int e) { return uint64_t(s_bases[e]) | uint64_t(tiles_of(s_bases[e], tile_m)) << 32; },
        [&](int e, uint64_t v) {
          s_offset[e] = static_cast<int>(v & 0xffffffffu);
          s_bases[e] = static_cast<int>(v >> 32);
        },
        s_warp);
  }
  __syncthreads();
#pragma unroll
  for (int u = 0; u < kExpertsPerScatterThread; ++u) {
    const int e = threadIdx.x + u * kScatterThreads;
    if (e < p.num_local) s_first[e] = s_offset[e] + base[u];
  }
  if (blockIdx.x == 0) {
    for (int e = threadIdx.x; e < p.num_local; e += blockDim.x) {
      p.expert_counts[e] = s_offset[e + 1] - s_offset[e];
      p.expert_offsets[e] = s_offset[e];
    }
    if (threadIdx.x == 0) p.expert_offsets[p.num_local] = s_offset[p.num_local];
  }

  if (has_rows) {
    // Pass 1 (votes; kMasks took it before the wait): each row's rank
    // among its warp's earlier rows of its expert, kPiecesAtOnce pieces a
    // step (their votes in flight together); only the lowest lane of each
    // group of equal experts moves the warp's counter, so the counters
    // need no atomics.
    const int span_begin = warp * span, span_end = span_begin + span;
    if constexpr (!kMasks) {
      for (int piece = span_begin; piece < span_end; piece += kPiecesAtOnce * kWarpSize) {
        int e[kPiecesAtOnce];
        unsigned same[kPiecesAtOnce];
        load_pieces(s_row, piece, span_end, lane, e);
#pragma unroll
        for (int j = 0; j < kPiecesAtOnce; ++j) same[j] = __match_any_sync(kFullMask, e[j]);
#pragma unroll
        for (int j = 0; j < kPiecesAtOnce; ++j) {
          const int i = piece + j * kWarpSize + lane;
          const int before = e[j] >= 0 ? s_cursor[warp][e[j]] : 0;
          __syncwarp();  // every lane has read its counter before the leader moves it
          if (e[j] >= 0 && (same[j] & lanes_below) == 0)
            s_cursor[warp][e[j]] = before + __popc(same[j]);
          if (i < span_end) s_row[i] = packed_row(e[j], before + __popc(same[j] & lanes_below));
          __syncwarp();
        }
      }
      __syncthreads();
      warp_bases<false>(p, s_cursor);
      __syncthreads();
    }

    // Pass 2: place the rows, each on its own (the warp that ranked them:
    // its bases are s_cursor[warp]); kPiecesAtOnce rows a lane read before
    // any is placed.
    for (int piece = span_begin; piece < span_end; piece += kPiecesAtOnce * kWarpSize) {
      int packed[kPiecesAtOnce];
      load_pieces(s_row, piece, span_end, lane, packed);
#pragma unroll
      for (int j = 0; j < kPiecesAtOnce; ++j) {
        const int i = piece + j * kWarpSize + lane;
        const int row = chunk_begin + i;
        if (i >= span_end || row >= p.rows) continue;
        const int e = packed_expert(packed[j]);
        if (e >= 0) {
          const int dst = s_first[e] + s_cursor[warp][e] + packed_rank(packed[j]);
          p.permuted_to_expanded[dst] = row;
          p.expanded_to_permuted[row] = dst;
        } else {
          p.expanded_to_permuted[row] = -1;
        }
      }
    }
  }

  write_tiles(p, s_offset, s_bases, s_warp);
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("launch_permute: " + message);
}

}  // namespace

std::size_t permute_scratch_bytes(int num_tokens, int top_k, int num_local) {
  const std::size_t cells = static_cast<std::size_t>(max_chunks(num_tokens * top_k)) * num_local;
  // Totals, counts, and the byte table 8-byte aligned (Layout).
  return ((num_local + cells + 1) / 2 * 2 + 2 * cells) * sizeof(int32_t);
}

PermuteCounts permute_counts(const PermuteParams& params) {
  PermuteCounts c;
  const Layout l = layout(params.num_tokens, params.top_k, params.num_local);
  c.rows = l.rows;
  c.chunk_rows = l.chunk_rows;
  c.num_chunks = l.num_chunks;
  c.local_offset = params.local_offset;
  c.num_local = params.num_local;
  if (l.rows > kCountScanRows && reinterpret_cast<uintptr_t>(params.scratch) % 8 == 0 &&
      params.scratch != nullptr)
    c.table = reinterpret_cast<uint64_t*>(static_cast<int32_t*>(params.scratch) + l.table);
  return c;
}

void launch_permute(const PermuteParams& params, const RoutingPlan& plan, KernelStream stream) {
  const bool counted = plan.routing_counts_rows;
  require(params.num_tokens >= 0 && params.top_k > 0 && params.local_offset >= 0,
          "need num_tokens >= 0, top_k > 0 and local_offset >= 0");
  require(params.num_local > 0 && params.num_local <= kMaxLocalExperts,
          "num_local must be 1.." + std::to_string(kMaxLocalExperts));
  require(static_cast<long long>(params.num_tokens) * params.top_k <= (1ll << 30),
          "num_tokens * top_k exceeds 2^30");
  require(params.num_tile_sizes >= 0 && params.num_tile_sizes <= kMaxTileSizes,
          "num_tile_sizes must be 0.." + std::to_string(kMaxTileSizes));
  for (int s = 0; s < params.num_tile_sizes; ++s)
    require(params.tile_m[s] > 0 && params.tiles[s] != nullptr && params.num_tiles[s] != nullptr,
            "each tile size needs tile_m > 0, tiles and num_tiles");
  require(params.scratch != nullptr && params.expert_counts != nullptr &&
              params.expert_offsets != nullptr,
          "scratch, expert_counts and expert_offsets must be set");
  const Layout l = layout(params.num_tokens, params.top_k, params.num_local);
  int32_t* scratch = static_cast<int32_t*>(params.scratch);
  int32_t* chunk_counts = scratch + l.chunk_counts;
  int32_t* totals = scratch + l.totals;

  // The scan and the scatter run for T = 0 too: totals, counts, offsets and
  // tile counts are still written (the scatter with one block and no rows).
  const int scan_blocks = ceil_div(params.num_local, kWarpSize);
  const int table_blocks = routing_shape::octet_count_blocks(params.top_k, l.chunk_rows);
  require(!counted || (l.rows > kCountScanRows && table_blocks > 0 &&
                       permute_counts(params).table != nullptr),
          "counted: only calls of more than " + std::to_string(kCountScanRows) +
              " expanded rows whose chunks are whole octet blocks, with 8-byte aligned scratch "
              "(routing_writes_counts)");
  // The token masks (only in the calls the octet kernel counted) and the
  // scan's early trigger, as the plan says.
  require(!plan.scatter_masks || counted, "the plan's scatter masks need the octet kernel's counts");
  require(plan.permute_chunks == std::max(l.num_chunks, 1),
          "the plan's permute chunks do not match the call");
  const bool masks = plan.scatter_masks;
  const bool trigger = plan.scan_triggers_scatter;
  // A scan kernel, instantiated with or without the trigger.
  const auto launch_scan = [&](auto with_trigger, auto without_trigger, auto&&... args) {
    launch_pdl(trigger ? with_trigger : without_trigger, scan_blocks, kScanThreads, 0, stream,
               args...);
    UNIMOE_LAUNCH_CHECK();
  };
  if (l.rows <= kCountScanRows) {
    launch_scan(permute_count_scan_kernel<true>, permute_count_scan_kernel<false>, params.topk_ids,
                l.rows, l.num_chunks, params.local_offset, params.num_local, chunk_counts, totals);
  } else if (counted) {
    const uint64_t* table = reinterpret_cast<const uint64_t*>(scratch + l.table);
    launch_scan(permute_scan_table_kernel<true>, permute_scan_table_kernel<false>, l.num_chunks,
                params.num_local, table_blocks, table, chunk_counts, totals);
  } else {
    launch_pdl(permute_count_kernel, l.num_chunks, kCountThreads, 0, stream, params.topk_ids,
               l.rows, l.chunk_rows, params.local_offset, params.num_local, chunk_counts);
    UNIMOE_LAUNCH_CHECK();
    launch_scan(permute_scan_kernel<true>, permute_scan_kernel<false>, l.num_chunks,
                params.num_local, chunk_counts, totals);
  }

  ScatterParams scatter{};
  scatter.topk_ids = params.topk_ids;
  scatter.rows = l.rows;
  scatter.chunk_rows = l.chunk_rows;
  scatter.num_chunks = l.num_chunks;
  scatter.local_offset = params.local_offset;
  scatter.num_local = params.num_local;
  scatter.chunk_base = chunk_counts;
  scatter.totals = totals;
  scatter.expert_counts = params.expert_counts;
  scatter.expert_offsets = params.expert_offsets;
  scatter.permuted_to_expanded = params.permuted_to_expanded;
  scatter.expanded_to_permuted = params.expanded_to_permuted;
  scatter.inv_top_k = inverse_of(params.top_k);
  scatter.num_tile_sizes = params.num_tile_sizes;
  for (int s = 0; s < params.num_tile_sizes; ++s) {
    scatter.tile_m[s] = params.tile_m[s];
    scatter.tiles[s] = params.tiles[s];
    scatter.num_tiles[s] = params.num_tiles[s];
  }
  launch_pdl(masks ? permute_scatter_kernel<true> : permute_scatter_kernel<false>,
             std::max(l.num_chunks, 1), kScatterThreads, 0, stream, scatter);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
