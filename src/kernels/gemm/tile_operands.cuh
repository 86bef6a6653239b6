// What the tiled grouped GEMMs (grouped_gemm.cu's mma.sync kernel and
// sm90_wgmma_gemm.cu's wgmma kernel) share around their multiply: the 16-byte
// cp.async copies of a tile's A rows (gathered from x for GEMM1) and its
// expert's B rows into swizzled shared memory, and the epilogue that adds the
// bias, applies the activation, stages the tile as bf16 and stores it with
// 16-byte writes. Contract of the arguments: grouped_gemm_args.cuh.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/gemm/grouped_gemm_args.cuh"
#include "kernels/gemm/warp_mma.cuh"

namespace unimoe {

inline constexpr int kTileBlockK = 64;               // K per pipeline stage: one swizzled row
inline constexpr int kTileChunks = kTileBlockK / 8;  // 16-byte chunks per row
static_assert(kTileBlockK * 2 == kSwizzleRowBytes, "a stage row is one swizzle row");

// A stage holds kTileM A rows, then kTileN B rows, each one 128-byte
// swizzled row of 64 K values (swizzled_offset). Thread `tid` copies chunk
// tid % 8 of rows tid / 8 + j * kRowsPerPass of both.
//
// TileRowsLoader copies the A rows; TileOperandLoader both. Rows r and
// r + kRowsPerPass share (r % 8), so one swizzled column serves every row
// a thread copies.
template <int kThreads, int kTileM>
struct TileRowsLoader {
  static constexpr int kRowsPerPass = kThreads / kTileChunks;
  static constexpr int kLoadsA = kTileM / kRowsPerPass;  // A rows a thread copies per stage
  static_assert(kRowsPerPass % 8 == 0, "threads must be a multiple of 64");
  static_assert(kTileM % kRowsPerPass == 0, "copy passes must cover whole tiles");
  static_assert(kLoadsA <= 32, "validity of a thread's rows is a 32-bit mask");

  const uint16_t* a_src[kLoadsA];  // row starts at this thread's chunk, or args.a past the tile
  uint32_t a_valid = 0;
  uint32_t copy_offset = 0;
  int chunk = 0;

  __device__ __forceinline__ TileRowsLoader(const GroupedGemmArgs& args, const DeviceTile& tile, int tid) {
    chunk = tid % kTileChunks;
    const int load_row = tid / kTileChunks;
    copy_offset = swizzled_offset(load_row, chunk);
#pragma unroll
    for (int j = 0; j < kLoadsA; ++j) {
      const int i = load_row + j * kRowsPerPass;
      a_src[j] = args.a;
      if (i < tile.rows) {
        const int r = tile.row_start + i;
        const int src_row = args.gather != nullptr ? args.gather[r] / args.top_k : r;
        a_src[j] = args.a + static_cast<size_t>(src_row) * args.k + chunk * 8;
        a_valid |= 1u << j;
      }
    }
  }

  // Copies K block k_tile of the A rows into the stage at shared address
  // `stage`; rows past the tile and the K tail are zero-filled.
  __device__ __forceinline__ void load(const GroupedGemmArgs& args, uint32_t stage, int k_tile) const {
    const int k_elem = k_tile * kTileBlockK;
    const bool k_ok = k_elem + chunk * 8 < args.k;
#pragma unroll
    for (int j = 0; j < kLoadsA; ++j) {
      const bool ok = k_ok && (a_valid >> j & 1u);
      cp_async_16(stage + copy_offset + j * kRowsPerPass * kSwizzleRowBytes, ok ? a_src[j] + k_elem : args.a,
                  ok ? 16 : 0);
    }
  }
};

// Gated B tiles interleave: B row 2c holds the gate row of output column
// n0 + c, row 2c + 1 its up row, so an accumulator pair (even column, odd
// column) of the MMA is one output column's (gate, up). Rows r and
// r + kRowsPerPass share r % 2, so a thread copies only gate rows or only
// up rows.
template <int kThreads, int kTileM, int kTileN>
struct TileOperandLoader {
  using Rows = TileRowsLoader<kThreads, kTileM>;
  static constexpr int kRowsPerPass = Rows::kRowsPerPass;
  static constexpr int kLoadsB = kTileN / kRowsPerPass;  // B rows a thread copies per stage
  static_assert(kTileN % kRowsPerPass == 0, "copy passes must cover whole tiles");
  static_assert(kLoadsB <= 32, "validity of a thread's rows is a 32-bit mask");

  Rows rows;
  const uint16_t* b_src = nullptr;
  size_t b_step = 0;
  uint32_t b_valid = 0;

  __device__ __forceinline__ TileOperandLoader(const GroupedGemmArgs& args, const DeviceTile& tile,
                                               bool gated, int n0, int tid)
      : rows(args, tile, tid) {
    const int load_row = tid / kTileChunks;
    const int first_col = gated ? n0 + (load_row >> 1) : n0 + load_row;
    const int col_step = gated ? kRowsPerPass / 2 : kRowsPerPass;
    const int first_b_row = gated && (load_row & 1) ? args.up_offset + first_col : first_col;
    b_src = args.b + (static_cast<size_t>(tile.expert) * args.b_rows + first_b_row) * args.k + rows.chunk * 8;
    b_step = static_cast<size_t>(col_step) * args.k;
#pragma unroll
    for (int j = 0; j < kLoadsB; ++j)
      if (first_col + j * col_step < args.n_out) b_valid |= 1u << j;
  }

  // Copies K block k_tile into the stage at shared address `stage`. Rows
  // past the tile, columns past n_out and the K tail are zero-filled.
  __device__ __forceinline__ void load(const GroupedGemmArgs& args, uint32_t stage, int k_tile) const {
    rows.load(args, stage, k_tile);
    const int k_elem = k_tile * kTileBlockK;
    const bool k_ok = k_elem + rows.chunk * 8 < args.k;
    const uint32_t b_dst = stage + rows.copy_offset + kTileM * kSwizzleRowBytes;
#pragma unroll
    for (int j = 0; j < kLoadsB; ++j) {
      const bool ok = k_ok && (b_valid >> j & 1u);
      cp_async_16(b_dst + j * kRowsPerPass * kSwizzleRowBytes, ok ? b_src + j * b_step + k_elem : args.b,
                  ok ? 16 : 0);
    }
  }
};

// The (tile, column block) work item of CTA blockIdx.x in a grid of
// max_tiles x n_blocks: its tile and first output column. A gated epilogue
// makes tile_n B rows into tile_n / 2 output columns.
struct TileWork {
  DeviceTile tile;
  bool gated;
  int out_cols;  // output columns of the CTA
  int n0;        // its first output column
};

// False for a CTA past the device tile count, which must return at once.
__device__ __forceinline__ bool tile_work(const DeviceTile* tiles, const int32_t* num_tiles, int n_blocks,
                                          GemmEpilogue epilogue, int tile_n, TileWork& w) {
  const int tile_index = blockIdx.x / n_blocks;
  if (tile_index >= *num_tiles) return false;
  w.tile = tiles[tile_index];
  w.gated = is_gated(epilogue);
  w.out_cols = w.gated ? tile_n / 2 : tile_n;
  w.n0 = (blockIdx.x - tile_index * n_blocks) * w.out_cols;
  return true;
}

// One accumulator pair (tile row `row`, tile columns col and col + 1, col
// even) with bias and activation, as bf16 into the staged tile [rows,
// stride]: one output column (col / 2) of a gated epilogue, two of a
// pointwise one.
__device__ __forceinline__ void stage_output_pair(const GroupedGemmArgs& args, const float* bias, bool gated,
                                                  int n0, __nv_bfloat16* staged, int stride, int row, int col,
                                                  float v0, float v1) {
  if (gated) {
    const int c = col >> 1;  // (gate, up) of output column n0 + c
    if (bias != nullptr && n0 + c < args.n_out) {
      v0 += bias[n0 + c];
      v1 += bias[args.up_offset + n0 + c];
    }
    staged[row * stride + c] =
        __float2bfloat16_rn(gated_activation(args.epilogue, v0, v1, args.alpha, args.limit));
  } else {
    // n_out is even, so columns n0 + col and n0 + col + 1 are valid together.
    if (bias != nullptr && n0 + col < args.n_out) {
      v0 += bias[n0 + col];
      v1 += bias[n0 + col + 1];
    }
    *reinterpret_cast<__nv_bfloat162*>(staged + row * stride + col) =
        __floats2bfloat162_rn(pointwise_activation(args.epilogue, v0), pointwise_activation(args.epilogue, v1));
  }
}

// The staged tile's rows < tile.rows and columns < n_out, out_cols a row,
// to args.out with 16-byte stores (n_out and out_cols are multiples of 8:
// a chunk is valid or not as a whole).
template <int kTileM, int kThreads>
__device__ __forceinline__ void store_staged_tile(const GroupedGemmArgs& args, const DeviceTile& tile,
                                                  const __nv_bfloat16* staged, int stride, int n0,
                                                  int out_cols, int tid) {
  const int chunks_per_row = out_cols / 8;
  for (int c = tid; c < kTileM * chunks_per_row; c += kThreads) {
    const int row = c / chunks_per_row;
    const int col = (c - row * chunks_per_row) * 8;
    if (row >= tile.rows || n0 + col >= args.n_out) continue;
    *reinterpret_cast<uint4*>(args.out + static_cast<size_t>(tile.row_start + row) * args.n_out + n0 + col) =
        *reinterpret_cast<const uint4*>(staged + row * stride + col);
  }
}

}  // namespace unimoe
