// Phases 2-4 of the fused routing kernels (fused_routing.cu) over a
// block's staged rows, s.expert[0, rows): permute_block takes the short
// paths up to 32 rows (block_permute_piece.cuh), one warp's sort of up to
// 64, the per-expert token masks where they fit the work area, else the
// general count, scan and scatter.
#pragma once

#include <cstdint>

#include "core/exact_quotient.h"
#include "kernels/permute/block_permute_piece.cuh"

#include "kernels/permute/block_permute_masks.cuh"
#include "kernels/permute/block_permute_sorted_pair.cuh"
#include "kernels/permute/block_permute_counts.cuh"

namespace unimoe::fused_detail {

// Phases 2-4 over s.expert[0, rows); every thread of the block calls it.
// kSortedPair: the kernel holds permute_sorted_pair. Holding it cost the
// threshold kernels of the policies without groups (E > 128, K >= 8) their
// other paths: measured on an H200 (best of 3), Renormalize/TopK/Default
// E=512 K=8 1.06-1.12x at T = 12..128, E=256 K=8 1.03-1.06x (0.97 at T = 6..8
// where it ran); every other kernel within 0.99-1.02 beyond 64 rows. So those
// kernels leave it out (fused_routing_kernels.cuh, kHoldsSortedPair).
//
// masks_cleared: the caller took clear_token_masks already (and a barrier
// since), where the masks serve.
template <bool kSortedPair = true>
__device__ inline void permute_block(const BlockPermuteParams& p, BlockShared& s,
                                     bool masks_cleared = false) {
  if (p.rows <= kWarpSize) {
    permute_piece(p, s);
    return;
  }
  if constexpr (kSortedPair) {
    if (sorted_pair_fits(p)) {
      permute_sorted_pair(p, s);
      return;
    }
  }
  if (token_masks_fit(p)) {
    permute_by_token_masks<0, 0>(p, s, masks_cleared);
    return;
  }
  permute_by_counts(p, s);
}

// The path permute_block_on_path takes, chosen by CTA 0 of the overlapped
// cluster kernel before its cluster barrier, while the routing CTAs route:
// after the barrier the choice is one register. permute_block's checks, made
// there instead, load the parameters again and divide (token_masks_fit's
// exact_quotient) on the permutation's chain.
// Measured on an H200 (scripts/routing_ab.sh -r 2 over the 1,344-point decode
// grid, against the checks after the barrier): the cluster variant
// 0.972-0.995 by geometric mean where the token masks serve (T = 12..96 at
// K = 8, T = 24..96 at K < 8; DeepSeekV3 E=256 K=8 T=64 4.87 -> 4.74 us, T=16
// 3.75 -> 3.62; Renormalize E=128 K=8 T=32 3.07 -> 2.98), 1.000-1.008 at
// T <= 8 (the fused block, whose code differed only in register names, read
// 0.999-1.004 in the same measurement) and 0.998-0.999 at T = 128.
// permute_block keeps its own checks for the fused kernels and the cluster
// kernel's other way (not measured in this form).
enum class BlockPermutePath : int {
  kPiece,
  kSortedPair,
  kTokenMasks,
  kTokenMasksK8OneWord,   // K = 8 and the mask words as constants, T <= 32
  kTokenMasksK8TwoWords,  // the same, T = 33..64
  kCounts,
};

// Whether path is one of the token masks' (the masks to be cleared first).
__device__ __forceinline__ bool takes_token_masks(BlockPermutePath path) {
  return path == BlockPermutePath::kTokenMasks ||
         path == BlockPermutePath::kTokenMasksK8OneWord ||
         path == BlockPermutePath::kTokenMasksK8TwoWords;
}

// The path for p, as permute_block would take it, and the token masks'
// constant forms where they serve (takes_constant_masks).
template <bool kSortedPair>
__device__ __forceinline__ BlockPermutePath block_permute_path(const BlockPermuteParams& p) {
  if (p.rows <= kWarpSize) return BlockPermutePath::kPiece;
  if (kSortedPair && sorted_pair_fits(p)) return BlockPermutePath::kSortedPair;
  if (!token_masks_fit(p)) return BlockPermutePath::kCounts;
  if (!takes_constant_masks(p)) return BlockPermutePath::kTokenMasks;
  return p.rows <= kConstantTopK * kWarpSize ? BlockPermutePath::kTokenMasksK8OneWord
                                             : BlockPermutePath::kTokenMasksK8TwoWords;
}

// Phases 2-4 on the path block_permute_path chose; masks_cleared as
// permute_block's.
template <bool kSortedPair>
__device__ inline void permute_block_on_path(const BlockPermuteParams& p, BlockShared& s,
                                             BlockPermutePath path, bool masks_cleared) {
  switch (path) {
    case BlockPermutePath::kPiece:
      permute_piece(p, s);
      return;
    case BlockPermutePath::kSortedPair:
      if constexpr (kSortedPair) permute_sorted_pair(p, s);
      return;
    case BlockPermutePath::kTokenMasks:
      permute_by_token_masks<0, 0>(p, s, masks_cleared);
      return;
    case BlockPermutePath::kTokenMasksK8OneWord:
      permute_by_token_masks<kConstantTopK, 1>(p, s, masks_cleared);
      return;
    case BlockPermutePath::kTokenMasksK8TwoWords:
      permute_by_token_masks<kConstantTopK, 2>(p, s, masks_cleared);
      return;
    default:
      permute_by_counts(p, s);
  }
}

}  // namespace unimoe::fused_detail
