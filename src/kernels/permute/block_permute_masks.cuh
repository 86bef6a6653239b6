// Phases 2-4 of the fused routing kernels by per-expert token masks
// (permute_by_token_masks): the packed per-expert sums, the mask functions,
// the two layouts (one tile size, packed) and the constant-K forms. Part of
// block_permute.cuh.
#pragma once

#include <cstdint>

#include "core/exact_quotient.h"
#include "kernels/permute/block_permute_piece.cuh"

namespace unimoe::fused_detail {

// Packed per-expert sums for the token-mask path: the row count in the low
// 16 bits, then the tiles of each tile size, 16 bits each (rows <=
// kFusedMaxRows, so no field overflows into the next).
constexpr int kFieldBits = 16;
static_assert(kFusedMaxRows < (1 << kFieldBits), "a packed field holds every row count");
static_assert((kMaxTileSizes + 1) * kFieldBits <= 64, "count and tiles pack into 64 bits");

__device__ __forceinline__ int packed_field(uint64_t packed, int field) {
  return static_cast<int>((packed >> (field * kFieldBits)) & ((1u << kFieldBits) - 1u));
}

// An expert's packed sums from its row count.
__device__ __forceinline__ uint64_t packed_sums(const BlockPermuteParams& p, int count) {
  uint64_t packed = static_cast<uint64_t>(count);
  // Unrolled: the sizes' quotients are independent of each other.
#pragma unroll
  for (int t = 0; t < kMaxTileSizes; ++t) {
    const int tiles = count == 0 || t >= p.num_tile_sizes
                          ? 0
                          : exact_quotient(count - 1, p.inv_tile_m[t]) + 1;
    packed |= static_cast<uint64_t>(tiles) << ((t + 1) * kFieldBits);
  }
  return packed;
}

// Expert e's count, offset and tiles of every schedule, from its packed
// sums and `before`, the packed sums of the experts below it (an exclusive
// scan): its first row and first tiles.
__device__ __forceinline__ void write_expert_layout(const BlockPermuteParams& p, int e,
                                                    uint64_t sums, uint64_t before) {
  const int start = packed_field(before, 0), count = packed_field(sums, 0);
  p.expert_offsets[e] = start;
  p.expert_counts[e] = count;
#pragma unroll 1
  for (int t = 0; t < p.num_tile_sizes; ++t) {
    const int base = packed_field(before, t + 1), tile_m = p.tile_m[t];
#pragma unroll 1
    for (int i = 0; i < packed_field(sums, t + 1); ++i) {
      const int row_start = start + i * tile_m;
      p.tiles[t][base + i] = DeviceTile{e, row_start, min(tile_m, start + count - row_start), 0};
    }
  }
}

// The last offset (every local row) and each schedule's tile count, from
// the packed sums of all experts.
__device__ __forceinline__ void write_layout_totals(const BlockPermuteParams& p, uint64_t total) {
  p.expert_offsets[p.num_local] = packed_field(total, 0);
#pragma unroll 1
  for (int t = 0; t < p.num_tile_sizes; ++t) *p.num_tiles[t] = packed_field(total, t + 1);
}

// 32-bit words of one expert's token mask for T tokens.
__host__ __device__ constexpr int mask_words(int num_tokens) { return (num_tokens + 31) / 32; }

// The token-mask permutation's forms (permute_by_token_masks<kTopK,
// kWords>): K and the mask words a thread handles as compile-time
// constants, or 0 for both at run time. CTA 0 of the overlapped cluster
// kernel takes a constant form where one serves (block_permute_path).
//
// The token of expanded row `row`: row / K (a shift for K = 8) where K is
// a constant, else by the reciprocal.
template <int kTopK>
__device__ __forceinline__ int token_of_row(int row, float inv_top_k) {
  if constexpr (kTopK > 0)
    return row / kTopK;
  else
    return exact_quotient(row, inv_top_k);
}

// The rows of one expert's token mask `mask` (its `words` words, kWords
// where that is a constant): unrolled where the words are constant.
template <int kWords>
__device__ __forceinline__ int mask_popcount(const uint32_t* mask, int words) {
  int count = 0;
  if constexpr (kWords > 0) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) count += __popc(mask[w]);
  } else {
#pragma unroll 1
    for (int w = 0; w < words; ++w) count += __popc(mask[w]);
  }
  return count;
}

// Adds to `rank` the rows of `mask` whose tokens lie in the words below
// `word`.
template <int kWords>
__device__ __forceinline__ void add_rows_below_word(const uint32_t* mask, int word, int& rank) {
  if constexpr (kWords > 0) {
#pragma unroll
    for (int w = 0; w < kWords - 1; ++w) rank += w < word ? __popc(mask[w]) : 0;
  } else {
#pragma unroll 1
    for (int w = 0; w < word; ++w) rank += __popc(mask[w]);
  }
}

// Whether permute_by_token_masks serves p: routing mode (a token's ids are
// distinct, so an expert has at most one row per token) and every expert's
// token mask fits in the work area.
__device__ __forceinline__ bool token_masks_fit(const BlockPermuteParams& p) {
  return p.distinct_per_token &&
         p.num_local * mask_words(exact_quotient(p.rows, p.inv_top_k)) <= kWorkWords;
}

// Phases 2-4 by token masks: bit t of expert e's mask is set when token t has
// a row at e. An expert's count is its mask's popcount, and a row's rank
// among its expert's rows (in increasing expanded index, which for distinct
// ids is increasing token) is the popcount of the bits below its token. A
// scan of each expert's count and tiles gives every offset and tile base
// (lay_out_one_size, or lay_out_packed for several tile sizes or runs of
// experts a thread). Three barriers (five with the packed layout) and no
// serial pass over the rows: the rows of decode batches (T * K of 65..4096;
// 33..64 take permute_sorted_pair) place in one step. Each step is a chain of
// dependent instructions (a row or an expert a thread), and it is their
// latency, not the issue rate, that sets its time: 500-1000 cycles a step at
// DeepSeekV3 T=16-64 (phase stamps on an H200), whether 8 or 32 warps run it.
// Its first step, zeroing the masks: CTA 0 of the cluster kernel takes it
// before its cluster barrier (`cleared`), while the routing CTAs route.
__device__ __forceinline__ void clear_token_masks(const BlockPermuteParams& p, BlockShared& s) {
  const int n = p.num_local * mask_words(exact_quotient(p.rows, p.inv_top_k));
#pragma unroll 1
  for (int i = threadIdx.x; i < n; i += blockDim.x) s.work.words[i] = 0;
}

// The layout where one tile size is asked for and every local expert has a
// thread of its own (thread e owns expert e): each owner thread's count and
// tiles pack into 32 bits (count low, tiles high: both at most the rows,
// under 2^16), the owner warps scan them, and after one barrier each owner
// warp's lanes sum the warp totals below it by shuffles. Two barriers in all
// (the block scan of the packed 64-bit sums takes three, then one for the
// layout), and only the owner warps run the scan and the layout.
// Measured on an H200: in one block from rows staged in shared memory
// (bench/probes/permute_floor.cu), 512 rows 2,340-2,510 cycles against the
// packed layout's 3,690-3,820 and 128 rows 1,880-2,260 against 3,020-3,570;
// in the routing calls where the masks serve (A/B against the packed layout),
// the cluster variant 0.91-0.94x (Renormalize E=128 K=8 T=64 3.68 -> 3.39 us,
// DeepSeekV3 E=256 K=8 T=64 5.52 -> 5.16).
__device__ __forceinline__ bool lays_out_one_size(const BlockPermuteParams& p) {
  return p.num_tile_sizes == 1 && p.num_local <= static_cast<int>(blockDim.x);
}

template <int kWords>
__device__ __forceinline__ void lay_out_one_size(const BlockPermuteParams& p, BlockShared& s,
                                                 const uint32_t* masks, int words) {
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int num_local = p.num_local;
  // Warp 0 owns at least the totals (no local experts: zeros).
  const int owners = max((num_local + kWarpSize - 1) / kWarpSize, 1);
  uint32_t* warp_totals = reinterpret_cast<uint32_t*>(s.scan);
  uint32_t mine = 0, inclusive = 0;
  if (warp < owners) {  // uniform per warp
    const int count = tid < num_local ? mask_popcount<kWords>(masks + tid * words, words) : 0;
    const int tiles = count == 0 ? 0 : exact_quotient(count - 1, p.inv_tile_m[0]) + 1;
    mine = static_cast<uint32_t>(count) | (static_cast<uint32_t>(tiles) << kFieldBits);
    inclusive = warp_inclusive_sum(mine, lane);
    if (lane == kWarpSize - 1) warp_totals[warp] = inclusive;
  }
  __syncthreads();
  if (warp < owners) {
    const uint32_t t = lane < owners ? warp_totals[lane] : 0u;
    uint32_t below = lane < warp ? t : 0u, total = t;
#pragma unroll
    for (int d = 1; d < kWarpSize; d *= 2) {
      below += __shfl_xor_sync(kFullMask, below, d);
      total += __shfl_xor_sync(kFullMask, total, d);
    }
    const uint32_t before = below + inclusive - mine;
    constexpr uint32_t kField = (1u << kFieldBits) - 1u;
    const int start = static_cast<int>(before & kField), count = static_cast<int>(mine & kField);
    if (tid < num_local) {
      const int tile_base = static_cast<int>(before >> kFieldBits), tile_m = p.tile_m[0];
      s.offsets[tid] = start;
      p.expert_offsets[tid] = start;
      p.expert_counts[tid] = count;
#pragma unroll 1
      for (int i = 0; i * tile_m < count; ++i)
        p.tiles[0][tile_base + i] =
            DeviceTile{tid, start + i * tile_m, min(tile_m, count - i * tile_m), 0};
    }
    if (tid == 0) {
      p.expert_offsets[num_local] = static_cast<int>(total & kField);
      *p.num_tiles[0] = static_cast<int>(total >> kFieldBits);
    }
  }
  step_stamp(s, 4, tid == 0);
  __syncthreads();
}

// The layout for any tile sizes and runs of experts a thread: each thread
// owns a run of consecutive experts, whose packed 64-bit sums (count, then
// the tiles of each size) one block scan turns into offsets and tile
// bases.
__device__ __forceinline__ void lay_out_packed(const BlockPermuteParams& p, BlockShared& s,
                                               const uint32_t* masks, int words) {
  const int tid = threadIdx.x, num_local = p.num_local;
  const int per_thread = p.experts_per_thread;
  const int first = min(tid * per_thread, num_local);
  const int last = min(first + per_thread, num_local);
  auto expert_sums = [&](int e) {
    return packed_sums(p, mask_popcount<0>(masks + e * words, words));
  };
  uint64_t mine = 0;
#pragma unroll 1
  for (int e = first; e < last; ++e) mine += expert_sums(e);
  step_stamp(s, 2, tid == 0);
  uint64_t total = 0;
  uint64_t next = block_exclusive_sum(mine, s.scan64, total, p.owner_warps);
  step_stamp(s, 3, tid == 0);
#pragma unroll 1
  for (int e = first; e < last; ++e) {
    const uint64_t sums = expert_sums(e);
    s.offsets[e] = packed_field(next, 0);
    write_expert_layout(p, e, sums, next);
    next += sums;
  }
  if (tid == 0) write_layout_totals(p, total);
  step_stamp(s, 4, tid == 0);
  __syncthreads();
}

// kTopK, kWords: K and the mask words as constants (both > 0: the call's
// K and mask_words(T), where lays_out_one_size(p) holds, as
// block_permute_path checks), or both 0 for any call the masks
// serve.
template <int kTopK, int kWords>
__device__ inline void permute_by_token_masks(const BlockPermuteParams& p, BlockShared& s,
                                              bool cleared) {
  static_assert((kTopK > 0) == (kWords > 0), "K and the words: both constants or neither");
  const int tid = threadIdx.x, threads = blockDim.x;
  const int rows = p.rows;
  const float inv_top_k = p.inv_top_k;
  const int words = kWords > 0 ? kWords : mask_words(exact_quotient(rows, inv_top_k));
  uint32_t* masks = reinterpret_cast<uint32_t*>(s.work.words);  // [num_local][words]
  if (!cleared) {
    clear_token_masks(p, s);
    __syncthreads();
  }
  step_stamp(s, 0, tid == 0);
#pragma unroll 1
  for (int row = tid; row < rows; row += threads) {
    const int e = s.expert[row];
    const int token = token_of_row<kTopK>(row, inv_top_k);
    if (e >= 0) atomicOr(&masks[e * words + token / 32], 1u << (token % 32));
  }
  __syncthreads();
  step_stamp(s, 1, tid == 0);
  if (kWords > 0 || lays_out_one_size(p))  // uniform
    lay_out_one_size<kWords>(p, s, masks, words);
  else
    lay_out_packed(p, s, masks, words);
  step_stamp(s, 5, tid == 0);

#pragma unroll 1
  for (int row = tid; row < rows; row += threads) {
    const int e = s.expert[row];
    if (e < 0) {
      p.expanded_to_permuted[row] = -1;
      continue;
    }
    const int token = token_of_row<kTopK>(row, inv_top_k);
    const uint32_t* mask = masks + e * words;
    int rank = __popc(mask[token / 32] & ((1u << (token % 32)) - 1u));
    add_rows_below_word<kWords>(mask, token / 32, rank);
    const int dst = s.offsets[e] + rank;
    p.permuted_to_expanded[dst] = row;
    p.expanded_to_permuted[row] = dst;
  }
  step_stamp(s, 6, tid == 0);
  step_stamp(s, 7, tid == threads - 1);
}

// Whether the token masks' constant form serves p (K = 8, T <= 64, one tile
// size, a thread an expert): permute_by_token_masks<8, 1> to T = 32, <8, 2>
// from 33. The constants make row / K a shift and unroll the mask loops. Only
// CTA 0 of the overlapped cluster kernel holds the constant forms
// (block_permute_path): at K = 8 and T = 9..64 the rule takes the cluster
// variant at every point of the full sweep, which is faster there than the
// fused block at every point.
// Measured on an H200 (scripts/routing_ab.sh -r 3 over the 1,344-point decode
// grid, against the run-time form alone):
//   - the cluster variant at K = 8, by geometric mean, 0.987-0.995 at
//     T = 12..32 and 0.974-0.976 at T = 48..64 (Renormalize E=128 T=64
//     3.38-3.39 -> 3.26-3.28 us, DeepSeekV3 E=256 T=64 4.95-5.03 ->
//     4.89-4.95);
//   - with the choice made after the cluster barrier (permute_block's
//     checks), holding the forms cost the kernel's other calls 1.004-1.017 at
//     T = 24..64 with K < 8 and 1.012-1.021 at T = 96; block_permute_path
//     takes most of that back (0.992-1.006 at T = 24..96 with K < 8:
//     block_permute.cuh).
// In one block, from rows staged in shared memory
// (bench/probes/permute_floor.cu, E=128 K=8 T=64): through permute_block
// 2,110-2,280 cycles against the run-time form's 2,410-2,590; the same form
// called in a kernel of its own 1,780-1,980; the probe's copy of the
// algorithm 1,500-1,850. So the constants take about 300 of the probe's
// 800-900-cycle margin. Most of the rest is the choice of path:
// permute_block's checks run about 50 more instructions a warp (parameter
// loads, token_masks_fit's division) before the first row moves (Nsight
// Compute).
constexpr int kConstantTopK = 8;

__device__ __forceinline__ bool takes_constant_masks(const BlockPermuteParams& p) {
  return p.top_k == kConstantTopK && p.rows <= kConstantTopK * 2 * kWarpSize &&
         lays_out_one_size(p);
}

}  // namespace unimoe::fused_detail
