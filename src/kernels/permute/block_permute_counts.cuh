// Phases 2-4 of the fused routing kernels on the general path: counts a
// scatter warp, a block scan, the scatter and the tiles (permute_by_counts).
// Part of block_permute.cuh.
#pragma once

#include <cstdint>

#include "core/exact_quotient.h"
#include "kernels/permute/block_permute_piece.cuh"

namespace unimoe::fused_detail {

// Phases 2-4 by counts a scatter warp, a scan and a scatter: the general
// path of permute_block.
__device__ __forceinline__ void permute_by_counts(const BlockPermuteParams& p, BlockShared& s) {
  const int tid = threadIdx.x, threads = blockDim.x;
  const int lane = tid % kWarpSize, warp = tid / kWarpSize;
  const unsigned lanes_below = (1u << lane) - 1u;
  const int num_local = p.num_local;
  // As many scatter warps as have counters in the work area and pieces to
  // take (fewer counters to clear and add up for small inputs); each takes
  // a span of whole pieces.
  const int scatter_warps =
      max(1, min(min(threads / kWarpSize, kWorkWords / num_local), (p.rows + kWarpSize - 1) / kWarpSize));
  const int pieces = (p.rows + kWarpSize - 1) / kWarpSize;
  const int span = (pieces + scatter_warps - 1) / scatter_warps * kWarpSize;
  const int span_begin = warp * span;
  const int span_end = min(span_begin + span, p.rows);

  // Phase 2: rows per (scatter warp, expert).
  for (int i = tid; i < scatter_warps * num_local; i += threads) s.work.words[i] = 0;
  __syncthreads();
  if (warp < scatter_warps) {
    int* cursor = s.work.words + warp * num_local;
    for_each_piece(s, span_begin, span_end, lane, [&](int, int e, unsigned same) {
      if (e >= 0 && (same & lanes_below) == 0) cursor[e] += __popc(same);
      __syncwarp();  // the next piece's leader sees this update
    });
  }
  __syncthreads();

  // Phase 3: each thread owns a run of consecutive experts.
  const int per_thread = p.experts_per_thread;
  const int first = min(tid * per_thread, num_local);
  const int last = min(first + per_thread, num_local);
  int mine = 0;
  // Loops over experts and warps stay rolled (here and below): the block runs
  // this code once per call, with its instructions not cached, so code size
  // costs more than loop overhead.
#pragma unroll 1
  for (int e = first; e < last; ++e)
#pragma unroll 1
    for (int w = 0; w < scatter_warps; ++w) mine += s.work.words[w * num_local + e];
  int total = 0;
  int next = block_exclusive_sum(mine, s.scan, total);
#pragma unroll 1
  for (int e = first; e < last; ++e) {
    s.offsets[e] = next;
    p.expert_offsets[e] = next;
    const int start = next;
#pragma unroll 1
    for (int w = 0; w < scatter_warps; ++w) {
      const int n = s.work.words[w * num_local + e];
      s.work.words[w * num_local + e] = next;
      next += n;
    }
    p.expert_counts[e] = next - start;
  }
  if (tid == 0) {
    s.offsets[num_local] = total;
    p.expert_offsets[num_local] = total;
  }
  __syncthreads();

  // Phase 4a: place the rows.
  if (warp < scatter_warps) {
    int* cursor = s.work.words + warp * num_local;
    for_each_piece(s, span_begin, span_end, lane, [&](int row, int e, unsigned same) {
      if (e >= 0) {
        const int dst = cursor[e] + __popc(same & lanes_below);
        p.permuted_to_expanded[dst] = row;
        p.expanded_to_permuted[row] = dst;
      } else if (row < span_end) {
        p.expanded_to_permuted[row] = -1;
      }
      __syncwarp();  // every lane has read its cursor before the leader moves it
      if (e >= 0 && (same & lanes_below) == 0) cursor[e] += __popc(same);
      __syncwarp();
    });
  }
  __syncthreads();  // the cursors are done: the work area takes the tile bases

  // Phase 4b: tile bases of every schedule (the first tile of each expert;
  // empty experts share their successor's), then the tiles.
#pragma unroll 1
  for (int t = 0; t < kMaxTileSizes; ++t) {
    if (t >= p.num_tile_sizes) break;
    int32_t* bases = s.work.words + t * (num_local + 1);
    int my_tiles = 0;
#pragma unroll 1
    for (int e = first; e < last; ++e) {
      const int count = s.offsets[e + 1] - s.offsets[e];
      my_tiles += count == 0 ? 0 : exact_quotient(count - 1, p.inv_tile_m[t]) + 1;
    }
    int num_tiles = 0;
    int base = block_exclusive_sum(my_tiles, s.scan, num_tiles);
#pragma unroll 1
    for (int e = first; e < last; ++e) {
      bases[e] = base;
      const int count = s.offsets[e + 1] - s.offsets[e];
      base += count == 0 ? 0 : exact_quotient(count - 1, p.inv_tile_m[t]) + 1;
    }
    if (tid == 0) {
      bases[num_local] = num_tiles;
      *p.num_tiles[t] = num_tiles;
    }
  }
  __syncthreads();
#pragma unroll 1
  for (int t = 0; t < kMaxTileSizes; ++t) {
    if (t >= p.num_tile_sizes) break;
    const int32_t* bases = s.work.words + t * (num_local + 1);
    const int num_tiles = bases[num_local];
    // Tile i belongs to the last expert whose first tile is <= i.
    for (int i = tid; i < num_tiles; i += threads) {
      int lo = 0, hi = num_local - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (bases[mid] <= i) lo = mid; else hi = mid - 1;
      }
      const int row_start = s.offsets[lo] + (i - bases[lo]) * p.tile_m[t];
      const int rows = min(p.tile_m[t], s.offsets[lo + 1] - row_start);
      p.tiles[t][i] = DeviceTile{lo, row_start, rows, 0};
    }
  }
}

}  // namespace unimoe::fused_detail
