// The GEMM2 gate's host side: which calls have two GEMM2 paths to choose
// from, the cost model the gate kernel evaluates on the device, and the
// record it writes. Pure host code (tests/cpu/test_gemm2_gate.cpp); the
// kernels are in kernels/gemm/gemm2_combine.cuh.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"
#include "unimoe/unimoe.h"

namespace unimoe {

// Rows (T * K) the combine path serves at most: its fp32 slots, 16 columns a
// row, live in 64 KB of shared memory.
inline constexpr int kCombineMaxRows = 1024;

// The two GEMM2 paths; the values are what the gate writes.
enum class Gemm2Path : int32_t { Expert = 0, Combine = 1 };

// How a call runs GEMM2: one path only, or both launched with the gate
// choosing on the device.
enum class Gemm2Mode { Expert, Combine, Gate };
const char* gemm2_mode_name(Gemm2Mode m);  // "expert", "combine", "gate"

// The routing outcome as the gate sees it, from the per-expert counts and
// the tile count.
struct Gemm2Work {
  int tiles = 0;   // the schedule's tiles (the expert path reads W2 once a tile)
  int rows = 0;    // P: rows on this rank
  int active = 0;  // local experts with at least one row
  int chunks = 0;  // sum over experts of ceil(rows / 16): the combine path's passes
};

// Predicted time in ns of one path: base + per_tile * tiles + per_row * rows
// + per_active * active + per_chunk * chunks.
struct Gemm2PathCost {
  float base = 0.0f;
  float per_tile = 0.0f;
  float per_row = 0.0f;
  float per_active = 0.0f;
  float per_chunk = 0.0f;
};

struct Gemm2GateModel {
  Gemm2PathCost expert;
  Gemm2PathCost combine;
};

// What the gate writes, per call (the layer's workspace; tests read it).
struct Gemm2GateRecord {
  int32_t path;           // Gemm2Path
  int32_t expert_tiles;   // the expert path's GEMM2 tile count: the schedule's, or 0
  int32_t combine_tiles;  // the combine kernel's: the schedule's, or 0
  int32_t finalize;       // 1: the finalize runs (expert path), 0: it returns at once
  int32_t rows;           // P: rows on this rank
  int32_t active;         // local experts with at least one row
  int32_t chunks;         // Gemm2Work::chunks
  int32_t tiles;          // the schedule's tile count
};

// Whether the combine path can serve a call of `num_tokens` tokens: BF16
// weights (the combine kernel reads W2 as bf16) and at most kCombineMaxRows
// rows. The path of GEMM1 does not matter: both BF16 GEMM1 paths that write
// act (mma, stream) leave it in permuted row order, as the combine reads it;
// the cutlass path's GEMM2 is not gated (its GEMM2 sizes are large).
bool combine_serves(const MoEConfig& config, int num_tokens);

// The model's coefficients for `config` (gemm2_gate.cpp states where each
// constant comes from).
Gemm2GateModel gemm2_gate_model(const MoEConfig& config);

// A path's predicted time, in fused multiply-adds in a fixed order, so the
// host (tests, the analysis) and the gate kernel get the same bits.
UNIMOE_HD float gemm2_path_cost(const Gemm2PathCost& c, const Gemm2Work& w) {
  float t = c.base;
  t = fmaf(c.per_tile, static_cast<float>(w.tiles), t);
  t = fmaf(c.per_row, static_cast<float>(w.rows), t);
  t = fmaf(c.per_active, static_cast<float>(w.active), t);
  t = fmaf(c.per_chunk, static_cast<float>(w.chunks), t);
  return t;
}

// The model's choice, as the gate kernel makes it: Combine when its
// predicted time is strictly lower.
UNIMOE_HD Gemm2Path gemm2_model_choice(const Gemm2GateModel& m, const Gemm2Work& w) {
  return gemm2_path_cost(m.combine, w) < gemm2_path_cost(m.expert, w) ? Gemm2Path::Combine
                                                                       : Gemm2Path::Expert;
}

}  // namespace unimoe
