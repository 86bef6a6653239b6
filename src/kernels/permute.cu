// Sort/permute: topk_ids -> expert counts and offsets, the two row maps and
// the tile schedules (contract: permute.cuh). Three fixed launches for a
// given T, so the chain captures once in a CUDA graph:
//   1. count:   each block counts one chunk of expanded rows per expert;
//   2. scan:    one block turns the counts into expert offsets, per-chunk
//               base rows, and the first tile of each expert per tile size;
//   3. scatter: each block re-reads its chunk and places every row at its
//               stable rank (rows of an expert in increasing expanded index),
//               and writes its share of the tile schedules.
// Expanded rows are split into chunks of whole warp pieces, and each chunk
// into one contiguous span per warp, so that ranks come from warp votes and
// per-warp counters in shared memory: no global atomics, the same result on
// every run.
#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/permute.cuh"

namespace unimoe {
namespace {

constexpr int kMaxLocalExperts = 1024;
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kCountThreads = 256;
constexpr int kScatterWarps = 8;
constexpr int kScatterThreads = kScatterWarps * kWarpSize;
constexpr int kScanThreads = 1024;
constexpr int kScanBatch = 12;  // chunks a scan thread loads at once (no spills at 64 registers)
// Chunk sizes: enough chunks to fill the GPU (about kTargetChunks), each
// within [kMinChunkRows, kMaxChunkRows] so that the scatter kernel can stage a
// chunk's experts in shared memory. Up to kSmallRows expanded rows the
// chunks are kSmallChunkRows long (at most 64 chunks). Measured on the H200
// (session 7 run 6, one call, the layer's permute stage, 256-row chunks
// against 1024): 4096 rows (T=512, K=8) 10.2 -> 7.4 us on qwen3-30b-a3b,
// 11.4 -> 8.5 on dsv3-tp8; 8192 rows (mixtral-8x7b T=4096) 10.4 -> 7.7;
// 16384 rows (gpt-oss-120b T=4096) 13.7 -> 12.5. At 32768 rows (T=4096,
// K=8) 128 chunks of 256 lost, 12.9 -> 15.9 on qwen3-30b-a3b: the scan's
// share grows with chunks x experts, so larger calls keep the 1024-row
// minimum.
constexpr int kSmallRows = 16384;
constexpr int kSmallChunkRows = 256;
constexpr int kMinChunkRows = 1024;
constexpr int kMaxChunkRows = 4096;
constexpr int kTargetChunks = 128;

static_assert(kSmallChunkRows % kScatterThreads == 0, "a chunk is whole pieces for every warp");
static_assert(kMinChunkRows % kScatterThreads == 0, "a chunk is whole pieces for every warp");
static_assert(kMaxChunkRows % kScatterThreads == 0, "a chunk is whole pieces for every warp");
static_assert(kScanThreads >= kMaxLocalExperts, "the scan gives every expert a thread");
static_assert(kScanThreads % kWarpSize == 0, "the scan works in whole warps");
static_assert(kMaxLocalExperts <= 32767, "staged experts are int16");

// How the expanded rows are cut into chunks, and where things lie in the
// scratch; the same for the scratch size and the launch.
struct Layout {
  int rows = 0;        // T * K
  int chunk_rows = 0;  // a multiple of kScatterThreads
  int num_chunks = 0;
  // Scratch, in int32: tile bases [kMaxTileSizes][E_local + 1], then chunk
  // counts [num_chunks][E_local].
  std::size_t tile_bases = 0;
  std::size_t chunk_counts = 0;
  std::size_t total = 0;
};

Layout layout(int num_tokens, int top_k, int num_local) {
  Layout l;
  l.rows = num_tokens * top_k;
  const int wanted = l.rows <= kSmallRows
                         ? kSmallChunkRows
                         : std::clamp(ceil_div(l.rows, kTargetChunks), kMinChunkRows, kMaxChunkRows);
  l.chunk_rows = ceil_div(wanted, kScatterThreads) * kScatterThreads;
  l.num_chunks = ceil_div(l.rows, l.chunk_rows);
  l.tile_bases = 0;
  l.chunk_counts = static_cast<std::size_t>(kMaxTileSizes) * (num_local + 1);
  l.total = l.chunk_counts + static_cast<std::size_t>(l.num_chunks) * num_local;
  return l;
}

// Local expert of an expanded row, or -1 when it is routed off this rank.
__device__ __forceinline__ int local_expert(const int32_t* topk_ids, int row, int rows,
                                            int local_offset, int num_local) {
  if (row >= rows) return -1;
  const int e = topk_ids[row] - local_offset;
  return (e >= 0 && e < num_local) ? e : -1;
}

// ---------------------------------------------------------------- count ----
// counts[chunk][e]: rows of the chunk routed to local expert e.
__global__ void __launch_bounds__(kCountThreads)
    permute_count_kernel(const int32_t* topk_ids, int rows, int chunk_rows, int local_offset,
                         int num_local, int32_t* chunk_counts) {
  pdl_begin();
  __shared__ int s_count[kMaxLocalExperts];
  for (int e = threadIdx.x; e < num_local; e += blockDim.x) s_count[e] = 0;
  __syncthreads();

  const int begin = blockIdx.x * chunk_rows;
  const int end = min(begin + chunk_rows, rows);
#pragma unroll 4
  for (int row = begin + threadIdx.x; row < end; row += blockDim.x) {
    const int e = local_expert(topk_ids, row, rows, local_offset, num_local);
    if (e >= 0) atomicAdd(&s_count[e], 1);
  }
  __syncthreads();

  int32_t* out = chunk_counts + static_cast<size_t>(blockIdx.x) * num_local;
  for (int e = threadIdx.x; e < num_local; e += blockDim.x) out[e] = s_count[e];
}

// ----------------------------------------------------------------- scan ----
// Exclusive scan of one value per thread over the whole block; returns the
// block total too. `s_warp` holds kWarpSize + 1 ints.
__device__ int block_exclusive_scan(int value, int* total, int* s_warp) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  int inclusive = value;
#pragma unroll
  for (int d = 1; d < kWarpSize; d *= 2) {
    const int other = __shfl_up_sync(kFullMask, inclusive, d);
    if (lane >= d) inclusive += other;
  }
  if (lane == kWarpSize - 1) s_warp[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int w = lane < num_warps ? s_warp[lane] : 0;
    int w_inclusive = w;
#pragma unroll
    for (int d = 1; d < kWarpSize; d *= 2) {
      const int other = __shfl_up_sync(kFullMask, w_inclusive, d);
      if (lane >= d) w_inclusive += other;
    }
    if (lane < num_warps) s_warp[lane] = w_inclusive - w;  // exclusive warp base
    if (lane == kWarpSize - 1) s_warp[kWarpSize] = w_inclusive;
  }
  __syncthreads();
  const int result = s_warp[warp] + inclusive - value;
  *total = s_warp[kWarpSize];
  __syncthreads();  // s_warp may be reused by the next call
  return result;
}

struct ScanParams {
  int num_chunks;
  int num_local;
  int threads_per_expert;  // power of two <= 32, times num_local <= kScanThreads
  int32_t* chunk_counts;   // [num_chunks][E_local] in: counts; out: rows of earlier chunks
  int32_t* tile_bases;     // [kMaxTileSizes][E_local + 1] out: first tile of each expert
  int32_t* expert_counts;
  int32_t* expert_offsets;
  int num_tile_sizes;
  int tile_m[kMaxTileSizes];
  int32_t* num_tiles[kMaxTileSizes];
};

// Per expert: exclusive scan of its counts over the chunks, in place; returns
// the expert's total. Each expert has threads_per_expert threads (aligned
// within a warp); each takes kScanBatch consecutive chunks per pass and loads
// them all before adding, so that a pass costs one memory round trip. Every
// thread of the block calls this (the shuffles need them all).
__device__ int scan_over_chunks(const ScanParams& p) {
  const int expert = threadIdx.x / p.threads_per_expert;
  const int part = threadIdx.x % p.threads_per_expert;
  const bool owns = expert < p.num_local;
  int32_t* column = p.chunk_counts + expert;
  int total = 0;  // the expert's rows in earlier passes
  for (int pass = 0; pass < p.num_chunks; pass += kScanBatch * p.threads_per_expert) {
    const int first_chunk = pass + part * kScanBatch;
    int n[kScanBatch];
    int sum = 0;
#pragma unroll
    for (int u = 0; u < kScanBatch; ++u) {
      const int c = first_chunk + u;
      n[u] = owns && c < p.num_chunks ? column[c * p.num_local] : 0;
      sum += n[u];
    }
    // Inclusive scan of the parts' sums within the expert's threads.
    int inclusive = sum;
    for (int d = 1; d < p.threads_per_expert; d *= 2) {
      const int other = __shfl_up_sync(kFullMask, inclusive, d, p.threads_per_expert);
      if (part >= d) inclusive += other;
    }
    int next = total + inclusive - sum;
#pragma unroll
    for (int u = 0; u < kScanBatch; ++u) {
      const int c = first_chunk + u;
      if (owns && c < p.num_chunks) column[c * p.num_local] = next;
      next += n[u];
    }
    total += __shfl_sync(kFullMask, inclusive, p.threads_per_expert - 1, p.threads_per_expert);
  }
  return total;
}

// One block of kScanThreads. After the scan over chunks, thread e owns local
// expert e.
__global__ void __launch_bounds__(kScanThreads, 1) permute_scan_kernel(ScanParams p) {
  pdl_begin();
  __shared__ int s_warp[kWarpSize + 1];
  __shared__ int s_count[kMaxLocalExperts];
  {
    const int expert_total = scan_over_chunks(p);
    const int expert = threadIdx.x / p.threads_per_expert;
    if (threadIdx.x % p.threads_per_expert == 0 && expert < p.num_local)
      s_count[expert] = expert_total;
  }
  __syncthreads();
  const int e = threadIdx.x;
  const bool owns = e < p.num_local;
  const int count = owns ? s_count[e] : 0;

  int total = 0;
  const int offset = block_exclusive_scan(count, &total, s_warp);
  if (owns) {
    p.expert_counts[e] = count;
    p.expert_offsets[e] = offset;
  }
  if (e == 0) p.expert_offsets[p.num_local] = total;

  // Unrolled so that the parameter arrays are indexed by constants (no local copy).
#pragma unroll
  for (int s = 0; s < kMaxTileSizes; ++s) {
    if (s >= p.num_tile_sizes) break;
    const int tile_m = p.tile_m[s];
    const int my_tiles = owns ? (count + tile_m - 1) / tile_m : 0;
    int num_tiles = 0;
    const int tile_base = block_exclusive_scan(my_tiles, &num_tiles, s_warp);
    int32_t* bases = p.tile_bases + s * (p.num_local + 1);
    if (owns) bases[e] = tile_base;
    if (e == 0) {
      bases[p.num_local] = num_tiles;
      *p.num_tiles[s] = num_tiles;
    }
  }
}

// -------------------------------------------------------------- scatter ----
struct ScatterParams {
  const int32_t* topk_ids;
  int rows;
  int chunk_rows;
  int local_offset;
  int num_local;
  const int32_t* chunk_base;      // [num_chunks][E_local] rows of earlier chunks
  const int32_t* expert_offsets;  // [E_local + 1]
  int32_t* permuted_to_expanded;
  int32_t* expanded_to_permuted;
  const int32_t* tile_bases;  // [kMaxTileSizes][E_local + 1]
  int num_tile_sizes;
  int tile_m[kMaxTileSizes];
  DeviceTile* tiles[kMaxTileSizes];
};

// Tile i of every schedule, spread over the whole grid so that one hot
// expert's many tiles do not serialize: tile i belongs to the last expert
// whose first tile is <= i (empty experts share their successor's base).
// The bases are staged in shared memory for the binary search; every thread
// of the block calls this.
__device__ void write_tiles(const ScatterParams& p, int* s_bases) {
  const int stride = gridDim.x * blockDim.x;
#pragma unroll
  for (int s = 0; s < kMaxTileSizes; ++s) {
    if (s >= p.num_tile_sizes) break;
    __syncthreads();  // the previous schedule's searches are done with s_bases
    const int32_t* bases = p.tile_bases + s * (p.num_local + 1);
    for (int e = threadIdx.x; e <= p.num_local; e += blockDim.x) s_bases[e] = bases[e];
    __syncthreads();
    const int num_tiles = s_bases[p.num_local];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < num_tiles; i += stride) {
      int lo = 0, hi = p.num_local - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (s_bases[mid] <= i) lo = mid; else hi = mid - 1;
      }
      const int row_start = p.expert_offsets[lo] + (i - s_bases[lo]) * p.tile_m[s];
      const int rows = min(p.tile_m[s], p.expert_offsets[lo + 1] - row_start);
      p.tiles[s][i] = DeviceTile{lo, row_start, rows, 0};
    }
  }
}

// The chunk's local experts are staged in shared memory first (one coalesced
// read, all loads in flight). Warp w then handles the w-th contiguous span of
// the chunk, 32 rows a piece, in order: pass 1 counts each warp's rows per
// expert; a scan over warps turns the counts into first rows; pass 2 places
// each row at its warp's cursor plus its rank among the piece's lanes of the
// same expert.
__global__ void __launch_bounds__(kScatterThreads) permute_scatter_kernel(ScatterParams p) {
  pdl_begin();
  __shared__ int s_cursor[kScatterWarps][kMaxLocalExperts];
  __shared__ int16_t s_expert[kMaxChunkRows];  // -1: off rank or past the end
  __shared__ int s_bases[kMaxLocalExperts + 1];  // one tile schedule's expert bases
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const unsigned lanes_below = (1u << lane) - 1u;
  const int chunk_begin = blockIdx.x * p.chunk_rows;
  const int span = p.chunk_rows / kScatterWarps;

  for (int i = threadIdx.x; i < kScatterWarps * p.num_local; i += blockDim.x)
    s_cursor[i / p.num_local][i % p.num_local] = 0;
#pragma unroll 4
  for (int i = threadIdx.x; i < p.chunk_rows; i += blockDim.x)
    s_expert[i] = static_cast<int16_t>(
        local_expert(p.topk_ids, chunk_begin + i, p.rows, p.local_offset, p.num_local));
  __syncthreads();

  // Pass 1: rows per (warp, expert). Only the lowest lane of each group of
  // equal experts writes, so the warp's counters need no atomics.
  for (int piece = warp * span; piece < (warp + 1) * span; piece += kWarpSize) {
    const int e = s_expert[piece + lane];
    const unsigned same = __match_any_sync(kFullMask, e);
    if (e >= 0 && (same & lanes_below) == 0) s_cursor[warp][e] += __popc(same);
    __syncwarp();
  }
  __syncthreads();

  // Counts -> first permuted row of each (warp, expert).
  const int32_t* base = p.chunk_base + static_cast<size_t>(blockIdx.x) * p.num_local;
  for (int e = threadIdx.x; e < p.num_local; e += blockDim.x) {
    int next = p.expert_offsets[e] + base[e];
    for (int w = 0; w < kScatterWarps; ++w) {
      const int n = s_cursor[w][e];
      s_cursor[w][e] = next;
      next += n;
    }
  }
  __syncthreads();

  // Pass 2: place the rows.
  for (int piece = warp * span; piece < (warp + 1) * span; piece += kWarpSize) {
    const int row = chunk_begin + piece + lane;
    const int e = s_expert[piece + lane];
    const unsigned same = __match_any_sync(kFullMask, e);
    if (e >= 0) {
      const int dst = s_cursor[warp][e] + __popc(same & lanes_below);
      p.permuted_to_expanded[dst] = row;
      p.expanded_to_permuted[row] = dst;
    } else if (row < p.rows) {
      p.expanded_to_permuted[row] = -1;
    }
    __syncwarp();  // every lane has read its cursor before the leader moves it
    if (e >= 0 && (same & lanes_below) == 0) s_cursor[warp][e] += __popc(same);
    __syncwarp();
  }

  write_tiles(p, s_bases);
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("launch_permute: " + message);
}

}  // namespace

std::size_t permute_scratch_bytes(int num_tokens, int top_k, int num_local) {
  return layout(num_tokens, top_k, num_local).total * sizeof(int32_t);
}

void launch_permute(const PermuteParams& params, cudaStream_t stream) {
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
  int32_t* tile_bases = scratch + l.tile_bases;

  if (l.num_chunks > 0) {
    launch_pdl(permute_count_kernel, l.num_chunks, kCountThreads, 0, stream,
        params.topk_ids, l.rows, l.chunk_rows, params.local_offset, params.num_local,
        chunk_counts);
    UNIMOE_LAUNCH_CHECK();
  }

  // Runs for T = 0 too: counts, offsets and tile counts are still written.
  ScanParams scan{};
  scan.num_chunks = l.num_chunks;
  scan.num_local = params.num_local;
  scan.threads_per_expert = kWarpSize;
  while (scan.threads_per_expert * params.num_local > kScanThreads) scan.threads_per_expert /= 2;
  scan.chunk_counts = chunk_counts;
  scan.tile_bases = tile_bases;
  scan.expert_counts = params.expert_counts;
  scan.expert_offsets = params.expert_offsets;
  scan.num_tile_sizes = params.num_tile_sizes;
  for (int s = 0; s < params.num_tile_sizes; ++s) {
    scan.tile_m[s] = params.tile_m[s];
    scan.num_tiles[s] = params.num_tiles[s];
  }
  launch_pdl(permute_scan_kernel, 1, kScanThreads, 0, stream, scan);
  UNIMOE_LAUNCH_CHECK();

  if (l.num_chunks > 0) {
    ScatterParams scatter{};
    scatter.topk_ids = params.topk_ids;
    scatter.rows = l.rows;
    scatter.chunk_rows = l.chunk_rows;
    scatter.local_offset = params.local_offset;
    scatter.num_local = params.num_local;
    scatter.chunk_base = chunk_counts;
    scatter.expert_offsets = params.expert_offsets;
    scatter.permuted_to_expanded = params.permuted_to_expanded;
    scatter.expanded_to_permuted = params.expanded_to_permuted;
    scatter.tile_bases = tile_bases;
    scatter.num_tile_sizes = params.num_tile_sizes;
    for (int s = 0; s < params.num_tile_sizes; ++s) {
      scatter.tile_m[s] = params.tile_m[s];
      scatter.tiles[s] = params.tiles[s];
    }
    launch_pdl(permute_scatter_kernel, l.num_chunks, kScatterThreads, 0, stream, scatter);
    UNIMOE_LAUNCH_CHECK();
  }
}

}  // namespace unimoe
