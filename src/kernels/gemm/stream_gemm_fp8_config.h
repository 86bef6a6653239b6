// The launch configuration of the FP8 stream GEMM (stream_gemm_fp8.cu) as
// plain host data: one function turns the problem into the whole config,
// which prints itself. No CUDA headers, so the rule can be checked on a CPU.
#pragma once

#include <string>

#include "core/tactics.h"

namespace unimoe {

struct Fp8StreamConfig {
  int splits = 1;        // warps along K on the multi-row path: 1, 2, 4 or 8
  int k_chunk = 0;       // K per split, a multiple of 128
  int unit_lanes = 32;   // one-token path: lanes that load one row piece (8, 16 or 32)
  int slots = 1;         // one-token path: pairs of one unit a warp (1, 2 or 4)
  int cols_per_cta = 0;  // output columns of a column block: (8 / splits) x (8 gated, else 16)
  int parts = 1;         // column blocks a CTA serves: 1, or 2 (wide)
  int n_blocks = 0;      // CTAs per tile: ceil(n_out / (parts x cols_per_cta))

  std::string to_string() const {
    return "splits " + std::to_string(splits) + " k_chunk " + std::to_string(k_chunk) +
           " unit_lanes " + std::to_string(unit_lanes) + " slots " + std::to_string(slots) +
           " cols_per_cta " + std::to_string(cols_per_cta) +
           " parts " + std::to_string(parts) + " n_blocks " + std::to_string(n_blocks);
  }
};

// The one-token path's pairs of one unit a warp: 8 slots (16 pairs of
// 16-byte loads a lane) would not fit 128 registers.
inline constexpr int kFp8StreamMaxSlots = 4;

// For k a positive multiple of 128 and n_out a multiple of 16:
//   splits: the BF16 stream kernel's rule (stream_k_splits) on K's bytes:
//     halve K per warp while each warp keeps at least 512 bytes (512 e4m3
//     values) of every row, so the dsv3-tp8 GEMM1 (H = 7168) spreads over 8
//     warps and GEMM2 (I = 256) keeps whole rows in one; 8 splits become 4
//     where that fills the waves better (sm_count <= 0 skips that);
//   k_chunk: K per split in whole 128-blocks, so a block never spans warps;
//   unit_lanes: the widest of 32, 16, 8 whose row piece (16 x lanes values)
//     divides k, so no lane idles on a ragged last piece, and whose 32 /
//     lanes units take the warp's 8 / splits pairs in at most 4 slots;
//     otherwise 32, the last piece ragged (only at 4 or 8 splits);
//   slots: (8 / splits) / (32 / unit_lanes);
//   parts: 2 (wide) where allowed, at 1 split with 16-lane units, when the
//     grid takes more than one wave of 2 CTAs an SM and half of it fits one:
//     the one-token path then takes 16 pairs a warp (8 slots), the loads of
//     two column blocks in flight together, and the multi-row path serves
//     the two blocks in turn. The dsv3-tp8 GEMM2 at T = 1 (8 tiles x 56
//     blocks = 448 CTAs, 1.7 waves on 132 SMs) becomes one wave of 224.
inline Fp8StreamConfig fp8_stream_config(int k, int n_out, bool gated, long long max_tiles,
                                         int sm_count, bool allow_wide = true) {
  constexpr int kWarps = 8, kBlockK = 128, kLaneK = 16;
  Fp8StreamConfig c;
  c.splits = stream_k_splits(k / 2, n_out, gated, max_tiles, sm_count);
  const int per_split = (k + c.splits - 1) / c.splits;
  c.k_chunk = (per_split + kBlockK - 1) / kBlockK * kBlockK;
  const int pairs = kWarps / c.splits;
  for (int lanes = 8; lanes <= 32; lanes *= 2)
    if (k % (kLaneK * lanes) == 0 && 32 / lanes <= pairs &&
        pairs * lanes / 32 <= kFp8StreamMaxSlots)
      c.unit_lanes = lanes;  // the widest that fits wins
  c.slots = pairs * c.unit_lanes / 32;
  c.cols_per_cta = pairs * (gated ? 8 : 16);
  c.n_blocks = (n_out + c.cols_per_cta - 1) / c.cols_per_cta;
  constexpr long long kCtasPerSm = 2;
  if (allow_wide && sm_count > 0 && c.splits == 1 && c.unit_lanes == 16) {
    const long long wave = kCtasPerSm * sm_count;
    const int wide_blocks = (n_out + 2 * c.cols_per_cta - 1) / (2 * c.cols_per_cta);
    if (max_tiles * c.n_blocks > wave && max_tiles * wide_blocks <= wave) {
      c.parts = 2;
      c.slots *= 2;
      c.n_blocks = wide_blocks;
    }
  }
  return c;
}

}  // namespace unimoe
