// Phases 2-4 of the fused routing kernels (fused_routing.cu) for at most
// 32 expanded rows, the decode calls: the block scan they share with the
// other ways, the scatter warps' pieces, and the two short paths
// (permute_counted_piece up to 16 rows, permute_sorted_piece up to 32), each
// with at most one barrier. Included by block_permute.cuh.
#pragma once

#include <cstdint>

#include "kernels/routing/fused_routing_shared.cuh"

namespace unimoe::fused_detail {

// The whole block meets (__syncthreads), or the threads [0, count) of it
// (whole warps; the others may be busy with something else: named barrier
// 2).
struct WholeBlock {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};
struct FirstThreads {
  int count;
  __device__ __forceinline__ void operator()() const {
    asm volatile("bar.sync 2, %0;" ::"r"(count) : "memory");
  }
};

// Exclusive sum of one value per thread over the block; `total` gets the sum
// of all. Every thread calls it (with FirstThreads{n} as `sync`, the
// threads [0, n) only); s_scan has kWarpSize + 1 entries. Only the
// first `active_warps` warps may pass a nonzero value: the others skip the
// shuffles and only meet the barriers (in a block of 32 warps whose first 4
// hold the values, the idle warps' shuffles would cost more issue cycles
// than the scan itself).
template <typename V, class Barrier = WholeBlock>
__device__ V block_exclusive_sum(V value, V* s_scan, V& total,
                                 int active_warps = kMaxThreads / kWarpSize, Barrier sync = {}) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = min(static_cast<int>(blockDim.x / kWarpSize), active_warps);
  V inclusive = value;
  if (warp < warps) {
    inclusive = warp_inclusive_sum(inclusive, lane);
    if (lane == kWarpSize - 1) s_scan[warp] = inclusive;
  }
  sync();
  if (warp == 0) {
    const V w = lane < warps ? s_scan[lane] : V(0);
    V w_inclusive = warp_inclusive_sum(w, lane);
    if (lane < warps) s_scan[lane] = w_inclusive - w;
    if (lane == kWarpSize - 1) s_scan[kWarpSize] = w_inclusive;
  }
  sync();
  const V result = warp < warps ? s_scan[warp] + inclusive - value : V(0);
  total = s_scan[kWarpSize];
  sync();  // s_scan may be reused by the next call
  return result;
}

// Scatter warp pieces: rows span_begin.. span_end of s.expert, 32 a piece
// in order; for each, every lane calls f(row, e, same) with e its row's
// expert (-1 past the span or off rank) and `same` the piece's lanes of
// that expert (__match_any_sync).
template <class F>
__device__ __forceinline__ void for_each_piece(const BlockShared& s, int span_begin, int span_end,
                                               int lane, F f) {
  for (int piece = span_begin; piece < span_end; piece += kWarpSize) {
    const int row = piece + lane;
    const int e = row < span_end ? s.expert[row] : -1;
    const unsigned same = __match_any_sync(kFullMask, e);
    f(row, e, same);
  }
}

// Rows of s.expert[0, rows) (rows <= 32) with a local expert below e[n], and
// with e[n], for each of kN experts: 8 rows a 16-byte load (the same address
// across the warp: a broadcast), each row's compares independent of the
// others' (measured on an H200: against a 2-byte load and a dependent add a
// row, 3-6% faster at T = 1..16).
struct RowsBelow {
  int below;
  int equal;
};

template <int kN>
__device__ __forceinline__ void rows_below(const BlockShared& s, int rows, const int (&e)[kN],
                                           RowsBelow (&out)[kN]) {
#pragma unroll
  for (int n = 0; n < kN; ++n) out[n] = RowsBelow{0, 0};
  const uint4* pieces = reinterpret_cast<const uint4*>(s.expert);
#pragma unroll 1
  for (int first = 0; first < rows; first += 8) {
    const uint4 v = pieces[first / 8];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int x = static_cast<int16_t>(j % 2 == 0 ? w[j / 2] & 0xffffu : w[j / 2] >> 16);
      const bool in = first + j < rows;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        // x is -1 off rank: as unsigned, never below e[n] >= 0.
        out[n].below += in && static_cast<unsigned>(x) < static_cast<unsigned>(e[n]);
        out[n].equal += in && x == e[n];
      }
    }
  }
}

__device__ __forceinline__ RowsBelow rows_below(const BlockShared& s, int rows, int e) {
  const int experts[1] = {e};
  RowsBelow out[1];
  rows_below(s, rows, experts, out);
  return out[0];
}

// Phases 2-4 for at most 16 rows (permute_piece), with no barrier: each
// thread counts the rows below and at its experts straight from s.expert,
// and the first warp, a lane per row, places the rows (rank among the lanes
// of the same expert) and writes the tiles, each expert's first lane its
// expert's. The same outputs as the general path; small inputs (decode) so
// run a short stretch of code. Only the threads from `first_thread` on (a
// multiple of 32) take part; the warps below may be busy with something
// else.
__device__ inline void permute_counted_piece(const BlockPermuteParams& p, const BlockShared& s,
                                      int first_thread) {
  const int tid = threadIdx.x - first_thread, lane = threadIdx.x % kWarpSize;
  const int num_local = p.num_local, rows = p.rows;
  if (tid < 0) return;
  // An expert a thread; where the threads are fewer than E_local (the
  // warps busy elsewhere), two a thread in one pass over the rows rather
  // than a second serial pass.
  const int stride = blockDim.x - first_thread;
  if (stride >= num_local) {
    if (tid < num_local) {
      const RowsBelow c = rows_below(s, rows, tid);
      p.expert_offsets[tid] = c.below;
      p.expert_counts[tid] = c.equal;
    }
  } else {
#pragma unroll 1
    for (int e = tid; e < num_local; e += 2 * stride) {
      const int experts[2] = {e, e + stride};
      RowsBelow c[2];
      rows_below(s, rows, experts, c);
      p.expert_offsets[e] = c[0].below;
      p.expert_counts[e] = c[0].equal;
      if (experts[1] < num_local) {
        p.expert_offsets[experts[1]] = c[1].below;
        p.expert_counts[experts[1]] = c[1].equal;
      }
    }
  }
  step_stamp(s, 0, tid == 0);
  step_stamp(s, 1, tid == min(stride, num_local) - 1);
  if (tid >= kWarpSize) return;

  const unsigned lanes_below = (1u << lane) - 1u;
  const int row = lane;
  const int e = row < rows ? s.expert[row] : -1;
  // The last offset, every local row, from the warp rather than a second
  // pass over the rows by thread 0 (the block is often exactly E_local wide).
  const unsigned local_rows = __ballot_sync(kFullMask, e >= 0);
  if (lane == 0) p.expert_offsets[num_local] = __popc(local_rows);
  const unsigned same = __match_any_sync(kFullMask, e);
  const int count = __popc(same);
  const int start = e >= 0 ? rows_below(s, rows, e).below : 0;
  if (e >= 0) {
    const int dst = start + __popc(same & lanes_below);
    p.permuted_to_expanded[dst] = row;
    p.expanded_to_permuted[row] = dst;
  } else if (row < rows) {
    p.expanded_to_permuted[row] = -1;
  }
  step_stamp(s, 2, tid == 0);
  const bool first_of_expert = e >= 0 && (same & lanes_below) == 0;
#pragma unroll 1
  for (int t = 0; t < kMaxTileSizes; ++t) {
    if (t >= p.num_tile_sizes) break;
    const int tile_m = p.tile_m[t];
    const int tiles = first_of_expert ? exact_quotient(count - 1, p.inv_tile_m[t]) + 1 : 0;
    // This expert's first tile: the tiles of the lower experts. Lanes from
    // `rows` on hold no row, so only the first `rows`, rounded up to 8, are
    // read (measured on an H200: the loop over all 32 lanes took about 1000
    // of a one-token call's 4000-9000 cycles).
    int base = 0, num_tiles = 0;
    const int lanes_read = (rows + 7) & ~7;
#pragma unroll 1
    for (int first = 0; first < lanes_read; first += 8) {
#pragma unroll
      for (int l = first; l < first + 8; ++l) {
        const int other_e = __shfl_sync(kFullMask, e, l);
        const int other_tiles = __shfl_sync(kFullMask, tiles, l);
        num_tiles += other_tiles;
        if (other_e < e) base += other_tiles;
      }
    }
#pragma unroll 1
    for (int i = 0; i < tiles; ++i) {
      const int row_start = start + i * tile_m;
      p.tiles[t][base + i] = DeviceTile{e, row_start, min(tile_m, start + count - row_start), 0};
    }
    if (lane == 0) *p.num_tiles[t] = num_tiles;
  }
  step_stamp(s, 3, tid == 0);
}

// Barrier among the threads from `first_thread` on (whole warps; the warps
// below may be busy with something else): named barrier 1.
__device__ __forceinline__ void sync_from(int first_thread) {
  asm volatile("bar.sync 1, %0;" ::"r"(static_cast<int>(blockDim.x) - first_thread) : "memory");
}

// Entries of sorted[0, 32) below x, for sorted ascending: a branchless
// binary search (six dependent loads, a broadcast each).
__device__ __forceinline__ int entries_below(const int32_t* sorted, int x) {
  int pos = 0;
#pragma unroll
  for (int step = kWarpSize / 2; step > 0; step /= 2)
    if (sorted[pos + step - 1] < x) pos += step;
  return pos + (sorted[pos] < x);
}

// Phases 2-4 for 17..32 rows (permute_piece): the first warp, a lane per
// row, sorts the rows by (local expert, row) with a bitonic network of
// shuffles; lane i then holds the row that goes to permuted position i (the
// rows of an expert stay in increasing expanded index, the stable order of
// ref::permute) and, where a run of one expert starts, writes its tiles.
// The sorted experts go to shared memory, and after one barrier the other
// threads find their experts' offsets and counts by binary search (the
// first warp too, after its rows, where it is alone). The same outputs as
// the general path. Only the threads from `first_thread` on (a multiple of
// 32) take part; the warps below may be busy with something else.
__device__ inline void permute_sorted_piece(const BlockPermuteParams& p, BlockShared& s,
                                     int first_thread) {
  const int tid = threadIdx.x - first_thread, lane = threadIdx.x % kWarpSize;
  if (tid < 0) return;
  const int num_local = p.num_local, rows = p.rows;
  int32_t* sorted = s.scan;  // [32]: the sorted rows' local experts, INT_MAX past them
  constexpr uint32_t kOffRank = kFusedMaxLocalExperts;  // after every local expert
  constexpr uint32_t kNoRow = 0xffffffffu;              // after every row
  uint32_t key = kNoRow;
  if (tid < kWarpSize) {
    if (lane < rows) {
      const int e = s.expert[lane];
      key = (e >= 0 ? static_cast<uint32_t>(e) : kOffRank) << 5 | static_cast<uint32_t>(lane);
    }
    // Bitonic sort, ascending over the lanes: unique keys, so no ties.
#pragma unroll
    for (int size = 2; size <= kWarpSize; size *= 2) {
#pragma unroll
      for (int stride = size / 2; stride > 0; stride /= 2) {
        const uint32_t other = __shfl_xor_sync(kFullMask, key, stride);
        const bool ascending = (lane & size) == 0;  // every lane in the last merge
        const bool low = (lane & stride) == 0;
        key = low == ascending ? min(key, other) : max(key, other);
      }
    }
    sorted[lane] = key < (kOffRank << 5) ? static_cast<int>(key >> 5) : INT_MAX;
  }
  step_stamp(s, 0, tid == 0);
  sync_from(first_thread);  // sorted[] complete
  step_stamp(s, 1, tid == 0);

  // Offsets and counts, a thread an expert: the threads after the first
  // warp, where there are any (the first warp places the rows meanwhile).
  const int threads = blockDim.x - first_thread;
  const int first_searcher = threads > kWarpSize ? kWarpSize : 0;
  auto offsets_and_counts = [&] {
#pragma unroll 1
    for (int e = tid - first_searcher; e < num_local; e += threads - first_searcher) {
      const int below = entries_below(sorted, e), through = entries_below(sorted, e + 1);
      p.expert_offsets[e] = below;
      p.expert_counts[e] = through - below;
    }
  };
  if (tid >= kWarpSize) {
    offsets_and_counts();
    return;
  }

  // Lane i: permuted position i.
  const bool local = key < (kOffRank << 5);
  const int e = local ? static_cast<int>(key >> 5) : -1;
  const int row = static_cast<int>(key & 31u);
  const unsigned local_lanes = __ballot_sync(kFullMask, local);  // lanes 0 .. L-1
  const int num_rows = __popc(local_lanes);
  if (local) {
    p.permuted_to_expanded[lane] = row;
    p.expanded_to_permuted[row] = lane;
  } else if (key != kNoRow) {
    p.expanded_to_permuted[row] = -1;
  }
  if (lane == 0) p.expert_offsets[num_local] = num_rows;
  step_stamp(s, 2, tid == 0);
  // Runs of one expert: each starts at a head lane and ends at the next one.
  const int previous_e = __shfl_up_sync(kFullMask, e, 1);
  const bool head = local && (lane == 0 || previous_e != e);
  const unsigned heads_above = __ballot_sync(kFullMask, head) & ~((2u << lane) - 1u);
  const int count = heads_above != 0u ? __ffs(heads_above) - 1 - lane : num_rows - lane;
#pragma unroll 1
  for (int t = 0; t < kMaxTileSizes; ++t) {
    if (t >= p.num_tile_sizes) break;
    const int tile_m = p.tile_m[t];
    const int tiles = head ? exact_quotient(count - 1, p.inv_tile_m[t]) + 1 : 0;
    // This expert's first tile: the tiles of the runs before it.
    int inclusive = warp_inclusive_sum(tiles, lane);
    const int base = inclusive - tiles;
#pragma unroll 1
    for (int i = 0; i < tiles; ++i)
      p.tiles[t][base + i] = DeviceTile{e, lane + i * tile_m, min(tile_m, count - i * tile_m), 0};
    if (lane == kWarpSize - 1) *p.num_tiles[t] = inclusive;
  }
  step_stamp(s, 3, tid == 0);
  if (first_searcher == 0) offsets_and_counts();
}

// Phases 2-4 for at most 32 rows (decode), by the threads from `first_thread`
// on (a multiple of 32; the warps below may be busy with something else): up
// to 16 rows each thread counts the rows at and below its experts (a pass
// over the rows: no barrier), beyond, one warp sorts the rows and the others
// search the sorted experts (one barrier). Measured on an H200: the sort's
// fixed cost (about 850 cycles) loses to counting at 8 rows (T=1 K=8:
// 1.04-1.12x slower) and wins where few threads count 24-32 rows (Renormalize
// E=128 K=8 T=3: 3593 -> 3012 cycles).
constexpr int kCountedPieceMaxRows = 16;

__device__ __forceinline__ void permute_piece(const BlockPermuteParams& p, BlockShared& s,
                                              int first_thread = 0) {
  if (p.rows <= kCountedPieceMaxRows) {
    permute_counted_piece(p, s, first_thread);
  } else {
    permute_sorted_piece(p, s, first_thread);
  }
}

}  // namespace unimoe::fused_detail
