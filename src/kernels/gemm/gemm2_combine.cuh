// The second GEMM2 path of the BF16 layer and the gate that picks between
// the two on the device.
//
// Expert path (grouped_gemm.cuh): GEMM2 writes y [P, H] bf16 in permuted row
// order, then the finalize reads every token's K rows of y back and sums
// them, weighted, in k order.
//
// Combine path (launch_combine_gemm2): one kernel computes GEMM2 and the
// weighted sum. A CTA owns 16 output columns of every token: its 8 warps
// take the schedule's tiles in turn, each multiplying 16 rows of W2 by the
// tile's act rows over I (the stream kernel's inner loop), and keep the fp32
// products in shared memory, one slot per permuted row; then the CTA sums
// each token's slots in k order, weighted, and writes out[t, 16 columns].
// No y, no finalize; the sum is the finalize's (fp32, k order, one bf16
// rounding at the store) over unrounded GEMM2 values. Few tiles leave warps
// idle, so K is split: `splits` warps share a tile's I range (2, 4 or 8
// while 4, 2 or 1 tiles), their partials added in split order. Only for
// calls of at most kCombineMaxRows rows (the slots live in shared memory).
//
// gemm2_gate: one warp, launched after the permute. It reads the per-expert
// counts and the tile count, evaluates each path's predicted time (a linear
// model whose coefficients the host computes from the config:
// plan/gemm2_gate.h), and writes Gemm2GateRecord: the choice and each path's
// work-item count. A gated call then runs GEMM1, the expert path's GEMM2
// (the gate's expert_tiles: 0 when it chose the combine, so it returns
// after its PDL wait without touching memory) and one tail kernel, the
// combine kernel given the gate's finalize flag: the combine where the gate
// chose it, the finalize where it did not. So both paths end in the same
// two kernels after GEMM1, and the expert path's chain is the ungated one's
// but for the gate.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/common.cuh"
#include "kernels/gemm/grouped_gemm.cuh"
#include "kernels/permute/permute.cuh"
#include "plan/gemm2_gate.h"

namespace unimoe {

struct Gemm2GateParams {
  const int32_t* expert_counts = nullptr;  // [E_local]
  int num_local = 0;
  const int32_t* num_tiles = nullptr;      // the schedule's count
  Gemm2GateModel model;
  int forced = -1;                         // -1: the model decides; else a Gemm2Path
  Gemm2GateRecord* record = nullptr;
};

// One warp. Reads the counts after its PDL wait; lets the next kernel
// launch at once (it waits for this one).
void launch_gemm2_gate(const Gemm2GateParams& params, KernelStream stream);

struct CombineGemm2Params {
  const uint16_t* act = nullptr;                  // [P, I] bf16, permuted rows
  const uint16_t* w2 = nullptr;                   // [E_local, H, I] bf16
  const float* b2 = nullptr;                      // [E_local, H] or nullptr
  const DeviceTile* tiles = nullptr;              // the schedule (any tile_m)
  const int32_t* num_tiles = nullptr;             // the gate's combine_tiles
  const int32_t* expanded_to_permuted = nullptr;  // [T * K], -1 off rank
  const float* topk_weights = nullptr;            // [T, K]
  int num_tokens = 0;
  int top_k = 0;
  int hidden = 0;        // H, a multiple of 8
  int intermediate = 0;  // I, a multiple of 8
  uint16_t* out = nullptr;  // [T, H] bf16; tokens with no on-rank row get 0
  // A call with no tiles at all (no row on this rank) still writes the
  // zeros: set for the combine path alone. Gated, num_tiles is the gate's
  // combine_tiles, 0 also when the gate chose the expert path, and the gate
  // sends a call with no tiles to the expert path, whose finalize writes them.
  bool zeros_when_empty = false;
  // The gated chain's tail (the kernel after the expert path's GEMM2): set
  // to the gate's finalize flag (Gemm2GateRecord::finalize). Where it reads
  // 1 (the gate chose the expert path, or the call has no tile) each CTA
  // runs the finalize for its 16 columns of every token instead of the
  // combine, with the finalize kernel's steps (finalize_device.cuh; the same
  // bits), over `finalize` (what launch_finalize would take). nullptr: the
  // combine kernel alone.
  const int32_t* tail_finalize = nullptr;
  FinalizeParams finalize;
};

// Shared-memory bytes the combine kernel takes for T * K rows.
std::size_t combine_smem_bytes(int rows);
// Throws std::runtime_error naming the bad field (T * K over
// kCombineMaxRows, H or I not multiples of 8, null pointers).
// `launch_next_early`: let the next kernel launch as this one starts (it
// waits for this kernel).
void launch_combine_gemm2(const CombineGemm2Params& params, bool launch_next_early,
                          KernelStream stream);

}  // namespace unimoe
