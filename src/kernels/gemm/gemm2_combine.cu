// The combining GEMM2 and the GEMM2 gate (contract: gemm2_combine.cuh).
#include "kernels/gemm/gemm2_combine.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/common/common.cuh"
#include "kernels/epilogue/finalize_device.cuh"
#include "kernels/gemm/stream_gemm_device.cuh"

namespace unimoe {
namespace {

using stream_device::kSlab;
using stream_device::kUnroll;
using stream_device::stream_k_range;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kCols = 16;        // output columns a CTA owns: one warp's 16 W2 rows
constexpr int kFragRows = 16;    // token rows one pass of the inner loop covers
constexpr int kMinSlotRows = 128;  // slots kept even for fewer rows, for the K splits

// Slot rows of a call of `rows` rows: room for `rows` rows once, or for the
// K splits of a call of few tiles (split s of row r at s * rows + r).
int slot_capacity(int rows) { return std::max(rows, kMinSlotRows); }

__global__ void __launch_bounds__(32) gemm2_gate_kernel(const Gemm2GateParams p) {
  // The next kernel (GEMM1) waits for this one in its own pdl_begin.
  pdl_launch_dependents();
  pdl_begin();
  const int lane = threadIdx.x;
  int rows = 0, active = 0, chunks = 0;
  for (int e = lane; e < p.num_local; e += 32) {
    const int c = p.expert_counts[e];
    rows += c;
    active += c > 0;
    chunks += (c + kFragRows - 1) / kFragRows;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    rows += __shfl_xor_sync(0xffffffffu, rows, offset);
    active += __shfl_xor_sync(0xffffffffu, active, offset);
    chunks += __shfl_xor_sync(0xffffffffu, chunks, offset);
  }
  if (lane != 0) return;
  Gemm2Work w;
  w.tiles = *p.num_tiles;
  w.rows = rows;
  w.active = active;
  w.chunks = chunks;
  // A call with no tiles takes the expert path: its finalize writes the
  // zeros (the combine kernel, reading 0 tiles, cannot tell that call from
  // one the gate did not give it).
  const int path = w.tiles == 0   ? static_cast<int>(Gemm2Path::Expert)
                   : p.forced >= 0 ? p.forced
                                   : static_cast<int>(gemm2_model_choice(p.model, w));
  const bool combine = path == static_cast<int>(Gemm2Path::Combine);
  Gemm2GateRecord r;
  r.path = path;
  r.expert_tiles = combine ? 0 : w.tiles;
  r.combine_tiles = combine ? w.tiles : 0;
  r.finalize = combine ? 0 : 1;
  r.rows = rows;
  r.active = active;
  r.chunks = chunks;
  r.tiles = w.tiles;
  *p.record = r;
}

struct CombineArgs {
  CombineGemm2Params p;
  bool launch_next_early;
  int slot_rows;  // T * K: split s of permuted row r is slot s * slot_rows + r
  int capacity;   // slot rows the shared memory holds
};

// K splits for `tiles` tiles: warps left idle by few tiles share a tile's K
// range, as long as every split's slots fit.
__device__ __forceinline__ int combine_splits(int tiles, int slot_rows, int capacity) {
  int s = tiles >= kWarps ? 1 : tiles >= kWarps / 2 ? 2 : tiles >= kWarps / 4 ? 4 : 8;
  while (s > 1 && s * slot_rows > capacity) s >>= 1;
  return s;
}

__global__ void __launch_bounds__(kThreads, 2) combine_gemm2_kernel(const CombineArgs a) {
  const CombineGemm2Params& p = a.p;
  if (a.launch_next_early) pdl_launch_dependents();
  // Every CTA waits, also one with nothing to do: the grid after this one
  // relies on this grid's completion meaning its predecessors completed.
  pdl_begin();
  if (p.tail_finalize != nullptr && *p.tail_finalize != 0) {
    // The gated tail, the expert path chosen: the finalize of this CTA's
    // columns (y is the previous kernel's output).
    const FinalizeParams& f = p.finalize;
    const int col0 = static_cast<int>(blockIdx.x) * kCols;
    const int vectors = min(kCols, f.hidden - col0) / finalize_device::kVector;
    for (int i = threadIdx.x; i < f.num_tokens * vectors; i += kThreads) {
      const int token = i / vectors;
      const int col = col0 + (i - token * vectors) * finalize_device::kVector;
      const finalize_device::GlobalRows rows{f, static_cast<size_t>(token) * f.top_k};
      *reinterpret_cast<uint4*>(f.out + static_cast<size_t>(token) * f.hidden + col) =
          finalize_device::token_columns<false>(f, rows, col);
    }
    return;
  }
  const int num_tiles = *p.num_tiles;
  if (num_tiles == 0) {
    if (!p.zeros_when_empty) return;
    const int cols = min(kCols, p.hidden - static_cast<int>(blockIdx.x) * kCols);
    __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out);
    for (int idx = threadIdx.x; idx < p.num_tokens * kCols; idx += kThreads)
      if (idx % kCols < cols)
        out[static_cast<size_t>(idx / kCols) * p.hidden + blockIdx.x * kCols + idx % kCols] =
            __float2bfloat16_rn(0.0f);
    return;
  }
  extern __shared__ float slots[];  // [capacity][kCols]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int col0 = blockIdx.x * kCols;
  const int splits = combine_splits(num_tiles, a.slot_rows, a.capacity);
  const int k_chunk = (p.intermediate + splits * kSlab - 1) / (splits * kSlab) * kSlab;

  // Fragment rows g and g + 8 are W2 rows (output columns) col0 + g and col0 + g + 8.
  const int row_lo = col0 + g, row_hi = col0 + g + 8;
  const bool lo_ok = row_lo < p.hidden, hi_ok = row_hi < p.hidden;
  const int items = num_tiles * splits;
  for (int item = warp; item < items; item += kWarps) {
    const int tile_index = item / splits, split = item - tile_index * splits;
    const DeviceTile tile = p.tiles[tile_index];
    const uint16_t* w =
        p.w2 + static_cast<size_t>(tile.expert) * p.hidden * p.intermediate + 8 * t;
    const uint16_t* w_lo = w + static_cast<size_t>(row_lo) * p.intermediate;
    const uint16_t* w_hi = w + static_cast<size_t>(row_hi) * p.intermediate;
    const int k_begin = split * k_chunk;
    const int k_end = min(p.intermediate, k_begin + k_chunk);
    const float* bias = p.b2 != nullptr && split == 0
                            ? p.b2 + static_cast<size_t>(tile.expert) * p.hidden
                            : nullptr;
    const float bias_lo = bias != nullptr && lo_ok ? bias[row_lo] : 0.0f;
    const float bias_hi = bias != nullptr && hi_ok ? bias[row_hi] : 0.0f;
    for (int r0 = 0; r0 < tile.rows; r0 += kFragRows) {
      const int frag_rows = min(kFragRows, tile.rows - r0);
      // Token fragment f holds rows 8f..8f+7 of this pass; this lane loads row 8f + g.
      const uint16_t* x_row[2];
      bool x_ok[2];
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        const int i = 8 * f + g;
        x_ok[f] = i < frag_rows;
        x_row[f] = x_ok[f] ? p.act + static_cast<size_t>(tile.row_start + r0 + i) * p.intermediate +
                                 8 * t
                           : p.act;
      }
      float acc[2][4] = {};
      if (frag_rows <= 8)
        stream_k_range<1, 2 * kUnroll, true>(w_lo, w_hi, lo_ok, hi_ok, x_row, x_ok, k_begin,
                                             k_end, t, acc);
      else
        stream_k_range<2, kUnroll, true>(w_lo, w_hi, lo_ok, hi_ok, x_row, x_ok, k_begin, k_end,
                                         t, acc);
      // Lane (g, t) holds columns g (c0, c1) and g + 8 (c2, c3) of pass rows 8f + 2t + j.
#pragma unroll
      for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int i = 8 * f + 2 * t + j;
          if (i >= frag_rows) continue;
          float* slot =
              slots + (static_cast<size_t>(split) * a.slot_rows + tile.row_start + r0 + i) * kCols;
          slot[g] = acc[f][j] + bias_lo;
          slot[g + 8] = acc[f][2 + j] + bias_hi;
        }
    }
  }
  __syncthreads();

  // ---- the combine: out[t, col] = sum over k in order of w[t, k] * (sum
  // over splits in order of the row's slots); fp32, one rounding.
  const int cols = min(kCols, p.hidden - col0);
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  for (int idx = threadIdx.x; idx < p.num_tokens * kCols; idx += kThreads) {
    const int token = idx / kCols, c = idx - token * kCols;
    if (c >= cols) continue;
    const size_t expanded = static_cast<size_t>(token) * p.top_k;
    float sum = 0.0f;
    for (int k = 0; k < p.top_k; ++k) {
      const int row = p.expanded_to_permuted[expanded + k];
      if (row < 0) continue;
      float v = slots[static_cast<size_t>(row) * kCols + c];
      for (int s = 1; s < splits; ++s)
        v += slots[(static_cast<size_t>(s) * a.slot_rows + row) * kCols + c];
      sum = fmaf(p.topk_weights[expanded + k], v, sum);
    }
    out[static_cast<size_t>(token) * p.hidden + col0 + c] = __float2bfloat16_rn(sum);
  }
}

void require(bool ok, const char* who, const std::string& message) {
  if (!ok) throw std::runtime_error(std::string(who) + ": " + message);
}

}  // namespace

std::size_t combine_smem_bytes(int rows) {
  return static_cast<std::size_t>(slot_capacity(rows)) * kCols * sizeof(float);
}

void launch_gemm2_gate(const Gemm2GateParams& p, KernelStream stream) {
  require(p.num_local > 0, "launch_gemm2_gate",
          "num_local is " + std::to_string(p.num_local) + "; must be > 0");
  require(p.expert_counts != nullptr && p.num_tiles != nullptr && p.record != nullptr,
          "launch_gemm2_gate", "expert_counts, num_tiles or record is null");
  require(p.forced >= -1 && p.forced <= static_cast<int>(Gemm2Path::Combine), "launch_gemm2_gate",
          "forced is " + std::to_string(p.forced) + "; allowed -1 (the model), 0 or 1");
  launch_pdl(gemm2_gate_kernel, 1, 32, 0, stream, p);
  UNIMOE_LAUNCH_CHECK();
}

void launch_combine_gemm2(const CombineGemm2Params& p, bool launch_next_early,
                          KernelStream stream) {
  const char* who = "launch_combine_gemm2";
  require(p.num_tokens >= 0, who, "num_tokens is " + std::to_string(p.num_tokens) + "; must be >= 0");
  require(p.top_k > 0, who, "top_k is " + std::to_string(p.top_k) + "; must be > 0");
  require(p.hidden > 0 && p.hidden % 8 == 0, who,
          "hidden is " + std::to_string(p.hidden) + "; must be a positive multiple of 8");
  require(p.intermediate > 0 && p.intermediate % 8 == 0, who,
          "intermediate is " + std::to_string(p.intermediate) + "; must be a positive multiple of 8");
  const long long rows = static_cast<long long>(p.num_tokens) * p.top_k;
  require(rows <= kCombineMaxRows, who,
          "num_tokens x top_k is " + std::to_string(rows) + "; the combine path serves at most " +
              std::to_string(kCombineMaxRows));
  if (p.num_tokens == 0) return;
  require(p.act != nullptr && p.w2 != nullptr && p.tiles != nullptr && p.num_tiles != nullptr &&
              p.expanded_to_permuted != nullptr && p.topk_weights != nullptr && p.out != nullptr,
          who, "act, w2, the tile schedule, the routing result or out is null");
  if (p.tail_finalize != nullptr) {
    FinalizeFold tail;  // the same checks as a folded finalize's
    tail.finalize = p.finalize;
    require(p.finalize.y != nullptr && finalize_fold_valid(tail, p.finalize.y, p.hidden) &&
                p.finalize.out == p.out &&
                p.finalize.num_tokens == p.num_tokens && p.finalize.top_k == p.top_k,
            who, "the tail's finalize needs y, out, the routing result, the call's T and K and "
                 "hidden = H");
  }
  CombineArgs a;
  a.p = p;
  a.launch_next_early = launch_next_early;
  a.slot_rows = static_cast<int>(rows);
  a.capacity = slot_capacity(a.slot_rows);
  const std::size_t smem = combine_smem_bytes(a.slot_rows);
  UNIMOE_CUDA_CHECK(cudaFuncSetAttribute(combine_gemm2_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  launch_pdl(combine_gemm2_kernel, ceil_div(p.hidden, kCols), kThreads, smem, stream, a);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
