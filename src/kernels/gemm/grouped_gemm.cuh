// The experts stages on the device for BF16: GEMM1 (gather + bias +
// activation), GEMM2 (+ bias) and the deterministic finalize. GEMM operands
// are K-major: C[m, n] = sum_k A[m, k] * B[n, k].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/common/common.cuh"
#include "kernels/permute/permute.cuh"
#include "core/tactics.h"
#include "unimoe/unimoe.h"

namespace unimoe {

struct Gemm1Params {
  const uint16_t* x = nullptr;                // [T, H] bf16
  const int32_t* permuted_to_expanded = nullptr;  // row r reads x[p2e[r] / top_k]
  int top_k = 0;
  const uint16_t* w13 = nullptr;              // [E_local, gemm1_cols, H] bf16, gate rows then up rows
  const float* b13 = nullptr;                 // [E_local, gemm1_cols] or nullptr
  const DeviceTile* tiles = nullptr;          // schedule for tactic.tile_m
  const int32_t* num_tiles = nullptr;         // device count
  int max_tiles = 0;                          // capacity (sizes the grid)
  int hidden = 0;                             // H (GEMM K)
  int intermediate = 0;                       // I (output columns)
  Activation activation = Activation::SwiGLU;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  uint16_t* act_out = nullptr;                // [P, I] bf16, permuted rows
  // Stream tactic only: let the next kernel launch once every CTA has
  // finished its loads (before its epilogue), so a stream GEMM2 with
  // schedule_ready_before_wait issues its first weight loads during this
  // kernel's tail. Ignored by the tiled tactics.
  bool trigger_dependents_early = false;
  // Stream tactic only, host side: its K splits at most this many (1, 2,
  // 4, 8; 0: stream_k_splits' rule, waves included), and whether one-row
  // tiles take the one-token path (512-byte row loads).
  int stream_max_splits = 0;
  bool stream_one_token = true;
};

struct Gemm2Params {
  const uint16_t* act = nullptr;              // [P, I] bf16
  const uint16_t* w2 = nullptr;               // [E_local, H, I] bf16
  const float* b2 = nullptr;                  // [E_local, H] or nullptr
  const DeviceTile* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  int max_tiles = 0;
  int hidden = 0;                             // H (output columns)
  int intermediate = 0;                       // I (GEMM K)
  uint16_t* y = nullptr;                      // [P, H] bf16, permuted rows
  // Stream tactic only: the tile schedule (and the weights) were complete
  // before the previous kernel in the stream began, so the kernel reads the
  // schedule and issues its first weight loads before waiting for that
  // kernel (PDL); act is read after the wait. True in the layer, where
  // GEMM2 follows GEMM1 and GEMM1 waited for the schedule's producer.
  bool schedule_ready_before_wait = false;
  // Stream tactic only: as Gemm1Params' (the finalize launches during this
  // kernel's tail and reads the routing outputs before its wait).
  bool trigger_dependents_early = false;
  // Stream tactic only, host side: its K splits at most this many (1, 2,
  // 4, 8; 0: stream_k_splits' rule, waves included), and whether one-row
  // tiles take the one-token path (512-byte row loads).
  int stream_max_splits = 0;
  bool stream_one_token = true;
};

struct FinalizeParams {
  const uint16_t* y = nullptr;                      // [P, H] bf16
  const int32_t* expanded_to_permuted = nullptr;    // [T * K], -1 off rank
  const float* topk_weights = nullptr;              // [T, K]
  int num_tokens = 0;
  int top_k = 0;
  int hidden = 0;
  uint16_t* out = nullptr;                          // [T, H] bf16; rows with no on-rank expert get 0
  // Optional: add weight * b2[expert] per row here, for a GEMM2 without a
  // bias epilogue. b2 [E_local, H] fp32; expert = topk_ids[t, k] - local_offset.
  const float* b2 = nullptr;
  const int32_t* topk_ids = nullptr;
  int local_offset = 0;
  // expanded_to_permuted, topk_weights and topk_ids were complete before the
  // previous kernel in the stream began: read them before the PDL wait, y
  // after it. True in the layer (routing runs before both GEMMs).
  bool routing_ready_before_wait = false;
  // Optional: the GEMM2 gate's finalize flag (Gemm2GateRecord::finalize,
  // gemm2_combine.cuh); where it reads 0 every CTA returns after its PDL
  // wait, writing nothing. nullptr: always runs.
  const int32_t* enabled = nullptr;
};

// The finalize folded into a decode GEMM2 (the FP8 and 4-bit stream
// kernels; kernels/epilogue/finalize_device.cuh): `counters` null, GEMM2
// writes y and the finalize kernel runs after it; else each CTA counts
// itself done in its column block's counter once its rows of y are written,
// and the CTA that completes a column block (the *num_tiles-th of it) sums
// the block's columns of every token as the finalize kernel would, the same
// bits. `finalize` is what the finalize kernel would take (y = GEMM2's
// output; `enabled` and routing_ready_before_wait are not read). counters:
// one int per column block of the GEMM2 grid, 0 before the call, and 0
// again after it (the completing CTA resets its own), so memory the caller
// zeroed once and keeps.
struct FinalizeFold {
  FinalizeParams finalize;
  int32_t* counters = nullptr;
};
// Whether a GEMM2 writing `y` [P, n_out] can fold `fold`: its finalize reads
// that y, hidden = n_out (a multiple of 8), top_k in 1..32, and its
// routing pointers, out (and topk_ids where b2 is set) are given; the
// launchers refuse a fold that is not.
bool finalize_fold_valid(const FinalizeFold& fold, const uint16_t* y, int n_out);

// Tactics compiled into the library, best first for large T.
const GemmTactic* gemm_tactics(int* count);
void launch_gemm1(const Gemm1Params& params, const GemmTactic& tactic, KernelStream stream);
void launch_gemm2(const Gemm2Params& params, const GemmTactic& tactic, KernelStream stream);
void launch_finalize(const FinalizeParams& params, KernelStream stream);

}  // namespace unimoe
