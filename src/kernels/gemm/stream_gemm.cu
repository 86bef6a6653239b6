// The stream (swap-AB) grouped GEMM (contract: stream_gemm.cuh).
//
// At decode an expert has a few rows, so a GEMM is a matrix-vector product
// whose cost is reading the expert's weights once. The tiled kernel puts the
// rows on the MMA's M side (16 rows, mostly padding) and stages weights
// through shared memory; this one swaps the operands: a warp takes 16 weight
// rows as the A operand of mma.sync m16n8k16 and the tile's (up to 16) rows
// as two n8 B fragments, and loads both straight from global memory into
// registers, 16 bytes per lane, kUnroll k-steps in flight (twice as many for
// tiles of at most 8 rows, which need one fragment). Nothing is staged
// in shared memory, so every warp is a stream of independent weight loads.
//
// The K order inside an m16n8k16 step is free (a dot product does not care)
// as long as A and B agree, so each lane loads 8 consecutive K values of its
// row with one 16-byte load and the fragments take them in this order: lane
// (g, t) holds real k 8t..8t+3 as the step-0 pairs (2t, 2t+1) and
// (2t+8, 2t+9), and 8t+4..8t+7 as step 1's. A 32-wide K slab is two steps.
//
// One-token tiles (every tile at T=1, most at T=8) take a second path in
// the same CTA geometry. Measured with `unimoe-bench --stream-patterns`
// on an H200: loads of 16 rows x 64 B per warp, as above, stream a 59 MB
// GEMM1 at 3.34 TB/s; loads of one 512-byte row piece per warp reach 3.73,
// and 3.11 against 2.83 TB/s at GEMM2's 29 MB. The mma fragment layout only
// allows 64 B of a row per load (lanes that share t share K), so this path
// breaks it on purpose: lane l loads 16 bytes at K offset 8l of two weight
// rows R0 and R1 (a warp load is 512 contiguous bytes of one row) and the
// token's 16 bytes at the same offset, and feeds them to m16n8k16 as A rows
// g (R0) and g + 8 (R1) and B column g. Entry (g, g) of the product is then
// R0's dot product over lane (g, t)'s K values, (g + 8, g) R1's; the other
// entries mix lanes and are dropped. A warp sums the diagonal over lanes at
// the end (the mma does 8x the useful work, which at one token is far below
// the tensor cores' rate). A pair is a gated column (gate, up) or two
// adjacent output columns.
//
// The 8 warps of a CTA split K `splits` ways and cover 8 / splits row groups;
// the partial sums meet in shared memory and are added in split order, so
// the result does not depend on timing. Gated GEMM1: a row group is 8 gate
// rows and the 8 matching up rows (fragment rows g and g + 8), so a lane
// holds (gate, up) of one output column and applies the activation in
// registers. Other GEMMs: 16 output columns per row group. On the
// one-token path the same CTA covers the same pairs, each warp taking its
// 8 / splits pairs over all of K with `splits` 256-wide pieces in flight.
//
// PDL (grouped_gemm.cuh): with prefetch_before_wait (the layer's GEMM2) a
// CTA reads its tile and, on the one-token path, issues its first round of
// weight loads before pdl_begin(); with early_dependents (the layer's
// stream GEMMs) it lets the next kernel launch once its loads are done.
#include "kernels/gemm/stream_gemm.cuh"

#include <cuda_bf16.h>

#include <climits>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "kernels/common/common.cuh"
#include "kernels/gemm/stream_gemm_device.cuh"
#include "kernels/gemm/warp_mma.cuh"
#include "core/tactics.h"

namespace unimoe {
namespace {

using stream_device::kSlab;
using stream_device::kUnroll;
using stream_device::load_weights;
using stream_device::stream_k_range;
using stream_device::word;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
static_assert(kStreamTileM == 16, "two n8 token fragments per tile");

struct StreamArgs {
  GroupedGemmArgs g;
  int splits = 1;   // warps along K: 1, 2, 4 or 8
  int k_chunk = 0;  // K per split, a multiple of kSlab
  bool one_token_path = true;  // UNIMOE_STREAM_ONE_TOKEN=0 turns it off (A/B timing)
};

// ---- One-token tiles: K-contiguous loads, the diagonal of each product.

constexpr int kRowPiece = 256;  // K a warp load covers: 32 lanes x 8 values

// This warp's kPairs pairs (first pair q0) of a one-token tile, kChunks
// 256-wide K pieces of each in flight: 2 x kPairs x kChunks weight loads a lane.
template <int kPairs, int kChunks>
__device__ __forceinline__ void stream_one_token(const GroupedGemmArgs& args,
                                                 const DeviceTile& tile, int q0, int lane) {
  const bool gated = is_gated(args.epilogue);
  const int pairs = gated ? args.n_out : args.n_out / 2;
  // Pair q0 + p's rows start at r0 + p * stride and r1 + p * stride; pairs
  // past the matrix (p >= valid) load nothing. No per-pair pointers: at 8
  // pairs they would take 32 registers.
  const int valid = pairs - q0;
  const size_t stride = static_cast<size_t>(gated ? 1 : 2) * args.k;
  const uint16_t* r0 = args.b + static_cast<size_t>(tile.expert) * args.b_rows * args.k +
                       static_cast<size_t>(gated ? q0 : 2 * q0) * args.k + 8 * lane;
  const uint16_t* r1 = r0 + static_cast<size_t>(gated ? args.up_offset : 1) * args.k;

  const uint16_t* x = nullptr;  // the token's A row, known after the wait
  float acc[kPairs][4] = {};
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int k0 = 0; k0 < args.k; k0 += kRowPiece * kChunks) {
    uint4 w0[kChunks][kPairs], w1[kChunks][kPairs], xv[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int k = k0 + c * kRowPiece;
      const bool k_ok = k + 8 * lane < args.k;
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        const bool load = k_ok && p < valid;
        w0[c][p] = load ? load_weights<false>(r0 + p * stride + k) : zero;
        w1[c][p] = load ? load_weights<false>(r1 + p * stride + k) : zero;
      }
    }
    // The first round's weight requests are out; A is the previous kernel's
    // output (GEMM2) or gathered through its permutation (GEMM1).
    if (k0 == 0) {
      pdl_begin();
      const int src =
          args.gather != nullptr ? args.gather[tile.row_start] / args.top_k : tile.row_start;
      x = args.a + static_cast<size_t>(src) * args.k + 8 * lane;
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int k = k0 + c * kRowPiece;
      xv[c] = k + 8 * lane < args.k ? __ldg(reinterpret_cast<const uint4*>(x + k)) : zero;
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int p = 0; p < kPairs; ++p)
#pragma unroll
        for (int step = 0; step < 2; ++step) {
          const uint32_t a[4] = {word(w0[c][p], 2 * step), word(w1[c][p], 2 * step),
                                 word(w0[c][p], 2 * step + 1), word(w1[c][p], 2 * step + 1)};
          mma_bf16_16816(acc[p], a, word(xv[c], 2 * step), word(xv[c], 2 * step + 1));
        }
  }

  if (args.early_dependents) pdl_launch_dependents();

  // Lane (g, t) holds columns 2t and 2t + 1: entry (g, g) when t == g / 2.
  const int g = lane >> 2, t = lane & 3;
  const bool diagonal = t == (g >> 1), odd = (g & 1) != 0;
  float u[kPairs][2];
#pragma unroll
  for (int p = 0; p < kPairs; ++p) {
    u[p][0] = diagonal ? (odd ? acc[p][1] : acc[p][0]) : 0.0f;
    u[p][1] = diagonal ? (odd ? acc[p][3] : acc[p][2]) : 0.0f;
  }
  // Afterwards every lane holds the warp's sum of pair lane >> (5 - log2
  // kPairs) in u[0] (warp_mma.cuh; the whole warp is one unit).
  reduce_slots<kPairs, 32>(u, lane);
  constexpr int kLanesPerUnit = 32 / kPairs;
  if (lane % kLanesPerUnit != 0) return;
  const int q = q0 + lane / kLanesPerUnit;
  if (q >= pairs) return;
  const int row0 = gated ? q : 2 * q;
  const int row1 = gated ? args.up_offset + q : 2 * q + 1;
  const float* bias =
      args.bias != nullptr ? args.bias + static_cast<size_t>(tile.expert) * args.b_rows : nullptr;
  const float v0 = u[0][0] + (bias != nullptr ? bias[row0] : 0.0f);
  const float v1 = u[0][1] + (bias != nullptr ? bias[row1] : 0.0f);
  __nv_bfloat16* out =
      reinterpret_cast<__nv_bfloat16*>(args.out) + static_cast<size_t>(tile.row_start) * args.n_out;
  if (gated) {
    out[q] = __float2bfloat16_rn(gated_activation(args.epilogue, v0, v1, args.alpha, args.limit));
  } else {
    out[row0] = __float2bfloat16_rn(pointwise_activation(args.epilogue, v0));
    out[row1] = __float2bfloat16_rn(pointwise_activation(args.epilogue, v1));
  }
}

__global__ void __launch_bounds__(kThreads, 2) stream_gemm_kernel(const StreamArgs sa) {
  const GroupedGemmArgs& args = sa.g;
  // With prefetch_before_wait the schedule is older than the previous
  // kernel (grouped_gemm.cuh): read it now, wait before reading A.
  if (!args.prefetch_before_wait) pdl_begin();
  const int tile_index = blockIdx.x / args.n_blocks;
  if (const int num_tiles = *args.num_tiles; tile_index >= num_tiles) {
    // A grid with no work at all (the GEMM2 gate chose the other path)
    // still completes only after its predecessor: CTA 0 waits, after
    // letting the next kernel launch (it waits for this grid in turn).
    if (args.prefetch_before_wait && num_tiles == 0 && blockIdx.x == 0) {
      pdl_launch_dependents();
      pdl_begin();
    }
    return;
  }
  const DeviceTile tile = args.tiles[tile_index];
  const int block = blockIdx.x - tile_index * args.n_blocks;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int groups = kWarps / sa.splits;
  // A CTA covers 8 x groups pairs in both paths; a warp takes `groups` of
  // them with all of K, `splits` pieces in flight (block- and grid-uniform).
  if (tile.rows == 1 && sa.one_token_path) {
    const int q0 = (block * kWarps + warp) * groups;
    switch (sa.splits) {
      case 8: stream_one_token<1, 8>(args, tile, q0, lane); return;
      case 4: stream_one_token<2, 4>(args, tile, q0, lane); return;
      case 2: stream_one_token<4, 2>(args, tile, q0, lane); return;
      default: stream_one_token<8, 1>(args, tile, q0, lane); return;
    }
  }
  pdl_begin();
  const int g = lane >> 2, t = lane & 3;
  const int split = warp % sa.splits, group = warp / sa.splits;
  const bool gated = is_gated(args.epilogue);
  const int group_cols = gated ? 8 : 16;
  const int col0 = (block * groups + group) * group_cols;

  // Fragment rows g and g + 8: weight rows lo and hi.
  const int row_lo = col0 + g;
  const int row_hi = gated ? args.up_offset + col0 + g : col0 + g + 8;
  const bool lo_ok = row_lo < args.n_out;
  const bool hi_ok = gated ? lo_ok : row_hi < args.n_out;
  const uint16_t* w = args.b + static_cast<size_t>(tile.expert) * args.b_rows * args.k + 8 * t;
  const uint16_t* w_lo = w + static_cast<size_t>(row_lo) * args.k;
  const uint16_t* w_hi = w + static_cast<size_t>(row_hi) * args.k;

  // Token fragment f holds tile rows 8f..8f+7; this lane loads row 8f + g.
  const uint16_t* x_row[2];
  bool x_ok[2];
#pragma unroll
  for (int f = 0; f < 2; ++f) {
    const int i = 8 * f + g;
    x_ok[f] = i < tile.rows;
    x_row[f] = args.a;
    if (x_ok[f]) {
      const int r = tile.row_start + i;
      const int src = args.gather != nullptr ? args.gather[r] / args.top_k : r;
      x_row[f] = args.a + static_cast<size_t>(src) * args.k + 8 * t;
    }
  }
  float acc[2][4] = {};
  const int k_begin = split * sa.k_chunk;
  const int k_end = min(args.k, k_begin + sa.k_chunk);
  // Warp-uniform: a tile of at most 8 rows has one token fragment, and the
  // registers of the second go to twice the weight loads in flight.
  if (tile.rows <= 8)
    stream_k_range<1, 2 * kUnroll, true>(w_lo, w_hi, lo_ok, hi_ok, x_row, x_ok, k_begin, k_end, t,
                                         acc);
  else
    stream_k_range<2, kUnroll, true>(w_lo, w_hi, lo_ok, hi_ok, x_row, x_ok, k_begin, k_end, t, acc);
  if (args.early_dependents) pdl_launch_dependents();

  // ---- K splits meet in shared memory; split 0 adds them in split order.
  if (sa.splits > 1) {
    __shared__ float partial[kWarps][8][32];
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
      for (int c = 0; c < 4; ++c) partial[warp][f * 4 + c][lane] = acc[f][c];
    __syncthreads();
    if (split != 0) return;
    for (int s = 1; s < sa.splits; ++s)
#pragma unroll
      for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[f][c] += partial[warp + s][f * 4 + c][lane];
  }

  // ---- epilogue: lane (g, t) holds rows lo (c0, c1) and hi (c2, c3) for
  // tile rows 8f + 2t and 8f + 2t + 1.
  const float* bias =
      args.bias != nullptr ? args.bias + static_cast<size_t>(tile.expert) * args.b_rows : nullptr;
  const float bias_lo = bias != nullptr && lo_ok ? bias[row_lo] : 0.0f;
  const float bias_hi = bias != nullptr && hi_ok ? bias[row_hi] : 0.0f;
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int i = 8 * f + 2 * t + j;
      if (i >= tile.rows) continue;
      __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(args.out) +
                           static_cast<size_t>(tile.row_start + i) * args.n_out;
      const float lo = acc[f][j] + bias_lo, hi = acc[f][2 + j] + bias_hi;
      if (gated) {
        if (lo_ok)
          out[row_lo] = __float2bfloat16_rn(gated_activation(args.epilogue, lo, hi, args.alpha,
                                                             args.limit));
      } else {
        if (lo_ok) out[row_lo] = __float2bfloat16_rn(pointwise_activation(args.epilogue, lo));
        if (hi_ok) out[row_hi] = __float2bfloat16_rn(pointwise_activation(args.epilogue, hi));
      }
    }
}

}  // namespace

void launch_stream_gemm(GroupedGemmArgs args, int max_tiles, const StreamGemmOptions& options,
                        KernelStream stream) {
  if (max_tiles == 0) return;
  StreamArgs sa;
  // Split K while each warp keeps at least 256 of it: long K
  // (GEMM1's H) spreads over all 8 warps, short K (GEMM2's I) keeps whole
  // rows per warp and more row groups per CTA; 8 splits become 4 where that
  // fills the waves better (stream_k_splits, src/core/tactics.h).
  // options.max_splits caps the splits and turns the wave rule off.
  const int max_splits = options.max_splits >= 1 && options.max_splits <= kWarps ? options.max_splits : 0;
  const bool gated = is_gated(args.epilogue);
  sa.splits = max_splits > 0
                  ? stream_k_splits(args.k, args.n_out, gated, max_tiles, 0, max_splits)
                  : stream_k_splits(args.k, args.n_out, gated, max_tiles, current_device_sm_count());
  sa.k_chunk = ceil_div(ceil_div(args.k, sa.splits), kSlab) * kSlab;
  const int cols_per_cta = (kWarps / sa.splits) * (is_gated(args.epilogue) ? 8 : 16);
  args.n_blocks = ceil_div(args.n_out, cols_per_cta);
  const long long blocks = static_cast<long long>(max_tiles) * args.n_blocks;
  if (blocks > INT_MAX)
    throw std::runtime_error("launch_stream_gemm: max_tiles x column blocks = " +
                             std::to_string(blocks) + " exceeds the grid limit");
  sa.one_token_path = options.one_token;
  sa.g = args;
  launch_pdl(stream_gemm_kernel, static_cast<unsigned>(blocks), kThreads, 0, stream, sa);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
