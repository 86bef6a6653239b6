// Phases 2-4 of the fused routing kernels for 33..64 rows: one warp sorts
// two keys a lane (permute_sorted_pair), the other warps find each expert's
// offset by binary search. Part of block_permute.cuh.
#pragma once

#include <climits>
#include <cstdint>

#include "core/exact_quotient.h"
#include "kernels/permute/block_permute_piece.cuh"

namespace unimoe::fused_detail {

// Entries of sorted[0, 64) below x, for sorted ascending: a branchless
// binary search (seven dependent loads, a broadcast each).
__device__ __forceinline__ int entries_below_64(const int32_t* sorted, int x) {
  int pos = 0;
#pragma unroll
  for (int step = kWarpSize; step > 0; step /= 2)
    if (sorted[pos + step - 1] < x) pos += step;
  return pos + (sorted[pos] < x);
}

// Whether permute_sorted_pair serves p: 33..64 rows, where the host lets it.
__device__ __forceinline__ bool sorted_pair_fits(const BlockPermuteParams& p) {
  return p.sorted_pair && p.rows <= 2 * kWarpSize;
}

// Phases 2-4 for 33..64 rows, as permute_sorted_piece does up to 32 with two
// keys a lane: the first warp sorts the rows by (local expert, row), row
// j * 32 + l's key in lane l's register j, by a bitonic network over the 64
// (shuffles, and one exchange within each lane where the stride is 32); lane
// l then holds permuted positions l and 32 + l, places their rows and, where
// a run of one expert starts, writes its tiles (a scan over both registers'
// lanes). The sorted experts go to the work area, and after one barrier the
// other warps (a block has at least 4) find each expert's offset and count by
// binary search. No barrier before the rows place, against the token masks'
// four: measured on an H200 (144 decode points of 33..64 rows,
// DeepSeekV3/Renormalize/TopK, E 64..1024, K 1..8, against the token masks in
// the same build), the cluster variant 0.77-0.94x (0.90 by geometric mean),
// the single block 0.92; Renormalize E=128 K=8 T=5..8 3.06-3.08 -> 2.83-2.84
// us, DeepSeekV3 E=256 K=8 3.75-3.78 -> 3.44-3.50. (Four warps sorting 32
// rows each, then merged by binary searches past a barrier, lost to the
// masks: 1.01-1.02x.)
__device__ inline void permute_sorted_pair(const BlockPermuteParams& p, BlockShared& s) {
  const int tid = threadIdx.x, lane = tid % kWarpSize;
  const int num_local = p.num_local, rows = p.rows;
  int32_t* sorted = s.work.words;  // [64]: the sorted rows' local experts, INT_MAX past them
  constexpr uint32_t kOffRank = kFusedMaxLocalExperts;  // after every local expert
  constexpr uint32_t kNoRow = 0xffffffffu;              // after every row
  constexpr int kRowBits = 6;
  uint32_t key[2] = {kNoRow, kNoRow};
  if (tid < kWarpSize) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = j * kWarpSize + lane;
      if (row < rows) {
        const int e = s.expert[row];
        key[j] = (e >= 0 ? static_cast<uint32_t>(e) : kOffRank) << kRowBits |
                 static_cast<uint32_t>(row);
      }
    }
    // Bitonic sort of element i = j * 32 + lane, ascending: unique keys.
#pragma unroll
    for (int size = 2; size <= 2 * kWarpSize; size *= 2) {
#pragma unroll
      for (int stride = size / 2; stride > 0; stride /= 2) {
        if (stride == kWarpSize) {  // size 64: within the lane, ascending
          const uint32_t low = min(key[0], key[1]), high = max(key[0], key[1]);
          key[0] = low;
          key[1] = high;
          continue;
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const uint32_t other = __shfl_xor_sync(kFullMask, key[j], stride);
          const bool ascending = ((j * kWarpSize + lane) & size) == 0;
          const bool low = (lane & stride) == 0;
          key[j] = low == ascending ? min(key[j], other) : max(key[j], other);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
      sorted[j * kWarpSize + lane] =
          key[j] < (kOffRank << kRowBits) ? static_cast<int>(key[j] >> kRowBits) : INT_MAX;
  }
  step_stamp(s, 0, tid == 0);
  sync_from(0);  // sorted[] complete
  step_stamp(s, 1, tid == 0);
  if (tid >= kWarpSize) {  // offsets and counts, a thread an expert
#pragma unroll 1
    for (int e = tid - kWarpSize; e < num_local; e += blockDim.x - kWarpSize) {
      const int below = entries_below_64(sorted, e), through = entries_below_64(sorted, e + 1);
      p.expert_offsets[e] = below;
      p.expert_counts[e] = through - below;
    }
    return;
  }

  // Register j of lane l: permuted position j * 32 + l.
  bool local[2];
  int e[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    local[j] = key[j] < (kOffRank << kRowBits);
    e[j] = local[j] ? static_cast<int>(key[j] >> kRowBits) : -1;
    const int row = static_cast<int>(key[j] & ((1u << kRowBits) - 1u)), place = j * kWarpSize + lane;
    if (local[j]) {
      p.permuted_to_expanded[place] = row;
      p.expanded_to_permuted[row] = place;
    } else if (key[j] != kNoRow) {
      p.expanded_to_permuted[row] = -1;
    }
  }
  const int num_rows =
      __popc(__ballot_sync(kFullMask, local[0])) + __popc(__ballot_sync(kFullMask, local[1]));
  if (lane == 0) p.expert_offsets[num_local] = num_rows;
  step_stamp(s, 2, tid == 0);
  // Runs of one expert: each starts at a head and ends at the next one.
  const int previous0 = __shfl_up_sync(kFullMask, e[0], 1);
  const int previous1 = __shfl_up_sync(kFullMask, e[1], 1);
  const int last0 = __shfl_sync(kFullMask, e[0], kWarpSize - 1);
  const bool head[2] = {local[0] && (lane == 0 || previous0 != e[0]),
                        local[1] && (lane == 0 ? last0 : previous1) != e[1]};
  const uint64_t heads = static_cast<uint64_t>(__ballot_sync(kFullMask, head[0])) |
                         static_cast<uint64_t>(__ballot_sync(kFullMask, head[1])) << kWarpSize;
  int count[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int place = j * kWarpSize + lane;
    const uint64_t above = heads & ~((2ull << place) - 1ull);
    count[j] = above != 0 ? __ffsll(static_cast<long long>(above)) - 1 - place : num_rows - place;
  }
#pragma unroll 1
  for (int t = 0; t < kMaxTileSizes; ++t) {
    if (t >= p.num_tile_sizes) break;
    const int tile_m = p.tile_m[t];
    int tiles[2], inclusive[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      tiles[j] = head[j] ? exact_quotient(count[j] - 1, p.inv_tile_m[t]) + 1 : 0;
      inclusive[j] = tiles[j];
    }
#pragma unroll
    for (int d = 1; d < kWarpSize; d *= 2) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int other = __shfl_up_sync(kFullMask, inclusive[j], d);
        if (lane >= d) inclusive[j] += other;
      }
    }
    const int total0 = __shfl_sync(kFullMask, inclusive[0], kWarpSize - 1);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int base = inclusive[j] - tiles[j] + (j == 1 ? total0 : 0);
      const int place = j * kWarpSize + lane;
#pragma unroll 1
      for (int i = 0; i < tiles[j]; ++i)
        p.tiles[t][base + i] =
            DeviceTile{e[j], place + i * tile_m, min(tile_m, count[j] - i * tile_m), 0};
    }
    if (lane == kWarpSize - 1) *p.num_tiles[t] = total0 + inclusive[1];
  }
  step_stamp(s, 3, tid == 0);
}

}  // namespace unimoe::fused_detail
