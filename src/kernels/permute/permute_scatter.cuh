// The permute chain's scatter kernel: expert offsets and tile schedules
// from the scan's totals, and every row placed at its stable rank
// (permute_scatter_kernel). Internal to permute.cu, which alone includes it
// (anonymous namespace).
#pragma once

#include <cstdint>

#include "core/exact_quotient.h"
#include "core/routing_launch_shape.h"
#include "kernels/common/common.cuh"
#include "kernels/permute/permute.cuh"
#include "kernels/permute/permute_count_scan.cuh"
#include "kernels/permute/permute_layout.cuh"

namespace unimoe {
namespace {

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

// The chunk's local experts are staged in shared memory first (every load in
// flight before the first is used), with the experts' totals and this chunk's
// base rows; the totals are scanned into expert offsets. Warp w then handles
// the w-th contiguous span of the chunk, 32 rows a piece, in order: pass 1
// ranks each row among its warp's earlier rows of the same expert (a per-warp
// counter a expert, and the rank among the piece's lanes of that expert, from
// one __match_any_sync), and packs the rank beside the expert; a scan over
// warps turns the counters into each warp's first row within the chunk's rows
// of that expert; pass 2 places each row at the chunk's first row of its
// expert plus its warp's base plus its rank: no vote and no order between the
// rows. A block past the rows (T = 0 launches one) writes only its share of
// the offsets and schedules.
// Why: where each id was stored to shared memory before the next load, ncu
// (T=16384) showed the ids loading one round trip at a time; and with a vote
// in each pass, each after the previous piece's counter update, each piece
// stalled its warp twice.
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

// kMasks (the calls the octet kernel counted, launch_permute's `counted`: a
// token's K experts are distinct, and a warp's span is 2 to 16 whole tokens,
// 2 * K rows a block of its chunk, octet_count_blocks): pass 1 ranks the rows
// by token masks instead of votes. Bit t of s_cursor[w][e], read as 16 bits,
// says that token t of warp w's span has a row at e (an atomicOr on the
// 32-bit word of two experts' masks); a row's rank is the popcount of the
// bits below its token's, and the warp's count of e the popcount of the mask.
// With nothing but the ids to read, pass 1 and the warp bases run before the
// wait, and the scan triggers this kernel even where its CTAs do not all find
// a free SM (scan_triggers_scatter).
// Measured on an H200 (DeepSeekV3/MiniMax2 E 128..384, K 4 and 8, T
// 2048..16384, against the votes in the same build): the masks after the
// wait, 0.97-0.98x at T=16384 K=8 (DeepSeekV3 E=256 21.34 -> 20.86 us);
// before it and triggered, 0.957 by geometric mean over 72 points, 0.88-0.96
// at T = 4096-16384 (DeepSeekV3 E=256 K=8 T=4096 13.96 -> 12.59, T=16384
// 22.24 -> 20.70).
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
  // s_first whole before pass 2 reads it. Without kMasks pass 1's barriers
  // order it; with kMasks pass 1 ran before the wait, and without this
  // barrier a warp could read an expert's s_first before its thread wrote
  // it (compute-sanitizer's racecheck found the race; its slower schedule
  // made rows land out of place).
  if constexpr (kMasks) __syncthreads();

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

}  // namespace
}  // namespace unimoe
