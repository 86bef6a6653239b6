// Device code of the FP8Block128 stream grouped GEMM: the one-token and
// multi-row paths and the kernel, one instantiation per one-token shape. The
// design, the fragment layouts and why the one-token path may scale before
// its reduction: stream_gemm_fp8.cu; the launch configuration:
// stream_gemm_fp8_config.h. Included by stream_gemm_fp8.cu only.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/common.cuh"
#include "kernels/epilogue/finalize_device.cuh"
#include "kernels/gemm/stream_gemm.cuh"
#include "kernels/gemm/stream_gemm_fp8.cuh"
#include "kernels/gemm/stream_gemm_fp8_config.h"
#include "kernels/gemm/warp_mma.cuh"
#include "kernels/quant/fp8_encode.cuh"

namespace unimoe::fp8_stream {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockK = 128;           // K of one scale block
constexpr int kLaneK = 16;             // K values (bytes) of one 16-byte lane load
constexpr int kSlabK = 4 * kLaneK;     // multi-row path: K per slab, 4 lanes a row
constexpr int kSlabsPerBlock = kBlockK / kSlabK;
constexpr int kUnroll = 4;             // multi-row slabs in flight, two token fragments
constexpr int kUnrollOneFragment = 6;  // the same for tiles of <= 8 rows (8 would spill)
constexpr int kLoadsInFlight = 16;     // one-token path: 16-byte weight loads a lane
constexpr int kScaleRows = 3;          // staged B scale rows: gate or all, up, up + 1
static_assert(kStreamTileM == 16, "two n8 token fragments per tile");
static_assert(kBlockK == 8 * kLaneK, "8 lanes of a unit cover one block");
static_assert((kUnroll * kSlabK) % kBlockK == 0 && (kUnrollOneFragment * kSlabK) % kBlockK == 0,
              "whole blocks per round");

struct Fp8StreamArgs {
  Fp8StreamGemmParams p;
  Fp8StreamConfig c;     // stream_gemm_fp8_config.h
  int k_blocks = 0;      // k / 128
  int b_row_blocks = 0;  // ceil(b_rows / 128)
  bool gated = false;
  // Where p.a_bf16 or p.a_f32 is set (the kernels whose kQuantizeA is
  // true), the raw A row is staged at this dynamic shared memory offset
  // (fp8_stream_smem_bytes).
  int raw_offset = 0;
};

// Dynamic shared memory of a launch: the token row's codes (k bytes), the A
// scales [k / 128][16] and the B scales [kScaleRows][k / 128]; where the
// kernel quantizes A itself, then the raw row (bf16 or fp32), 16-byte
// aligned. *raw_offset gets where it starts.
inline size_t fp8_stream_smem_bytes(const Fp8StreamGemmParams& p, int* raw_offset) {
  const size_t scales = sizeof(float) * (kStreamTileM + kScaleRows) * (p.k / kBlockK);
  const size_t offset = (p.k + scales + 15) / 16 * 16;
  *raw_offset = static_cast<int>(offset);
  const size_t raw = p.a_bf16 != nullptr ? sizeof(uint16_t) * p.k
                     : p.a_f32 != nullptr ? sizeof(float) * p.k
                                          : 0;
  return raw == 0 ? p.k + scales : offset + raw;
}

// Weights are read once: bypass L1 (stream_gemm.cu says when the L2 hint pays).
template <bool kLine128>
__device__ __forceinline__ uint4 load_weights(const uint8_t* p) {
  uint4 v;
  if constexpr (kLine128)
    asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  else
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// c += the two m16n8k32 e4m3 k-steps of one 16-byte load a lane: lo and hi
// are A rows g and g + 8, x is B column g (the K order: stream_gemm_fp8.cu).
__device__ __forceinline__ void mma_load(float (&c)[4], const uint4& lo, const uint4& hi,
                                         const uint4& x) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(lo.x), "r"(hi.x), "r"(lo.y), "r"(hi.y), "r"(x.x), "r"(x.y));
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(lo.z), "r"(hi.z), "r"(lo.w), "r"(hi.w), "r"(x.z), "r"(x.w));
}

__device__ __forceinline__ int source_row(const Fp8StreamGemmParams& p, int permuted_row) {
  return p.gather != nullptr ? p.gather[permuted_row] / p.top_k : permuted_row;
}

__device__ __forceinline__ void store_out(const Fp8StreamGemmParams& p, size_t i, float v) {
  if (p.out_f32 != nullptr)
    p.out_f32[i] = v;
  else
    p.out_bf16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// Output row out_row from the sums v0, v1 of weight rows r0, r1 (gate and up,
// or two columns): bias, then the activation of (v0, v1) at column r0, or of
// each at its own column. kMax: returns the largest |value| stored (fmaxf:
// NaN skipped; 0 for none), for the out_maxima kernels; else 0.
template <bool kMax>
__device__ __forceinline__ float store_pair(const Fp8StreamArgs& args, int expert, size_t out_row,
                                            int r0, int r1, float v0, float v1, bool ok0, bool ok1) {
  const Fp8StreamGemmParams& p = args.p;
  const float* bias = p.bias != nullptr ? p.bias + static_cast<size_t>(expert) * p.b_rows : nullptr;
  v0 += bias != nullptr && ok0 ? bias[r0] : 0.0f;
  v1 += bias != nullptr && ok1 ? bias[r1] : 0.0f;
  if constexpr (!kMax) {
    if (args.gated) {
      if (ok0) store_out(p, out_row + r0, gated_activation(p.epilogue, v0, v1, p.alpha, p.limit));
    } else {
      if (ok0) store_out(p, out_row + r0, pointwise_activation(p.epilogue, v0));
      if (ok1) store_out(p, out_row + r1, pointwise_activation(p.epilogue, v1));
    }
    return 0.0f;
  } else {
    float stored = 0.0f;
    if (args.gated) {
      if (ok0) {
        const float a = gated_activation(p.epilogue, v0, v1, p.alpha, p.limit);
        store_out(p, out_row + r0, a);
        stored = fmaxf(stored, fabsf(a));
      }
    } else {
      if (ok0) {
        const float a = pointwise_activation(p.epilogue, v0);
        store_out(p, out_row + r0, a);
        stored = fmaxf(stored, fabsf(a));
      }
      if (ok1) {
        const float a = pointwise_activation(p.epilogue, v1);
        store_out(p, out_row + r1, a);
        stored = fmaxf(stored, fabsf(a));
      }
    }
    return stored;
  }
}

// The staged B scale row (1 or 2) of up row `row` of column block `block`;
// rows past the matrix clamp to 2, and any row to 1 or 2, so that a load
// the compiler hoists out of a not-gated select stays in bounds.
__device__ __forceinline__ int up_scale_row(const Fp8StreamArgs& args, int block, int row) {
  const int d = row / kBlockK - (args.p.up_offset + block * args.c.cols_per_cta) / kBlockK;
  return 1 + min(max(d, 0), 1);
}

// Staging holds no registers while a round of weight loads is in flight.
// Copies 4 bytes, or writes 0 where !valid (src must still be an address).
__device__ __forceinline__ void cp_async_4(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 4 : 0));
}

// b_sm[r][kb]: the scales of the B row blocks of column block `block` and
// on (0 past the matrix): gated, the gate's block (r = 0) and the up rows'
// two (r = 1, 2); otherwise the block and, for a wide CTA's second column
// block, the next (r = 1).
__device__ __forceinline__ void stage_b_scales(const Fp8StreamArgs& args, int expert, int block,
                                               float* b_sm) {
  const int rb0 = block * args.c.cols_per_cta / kBlockK;
  const int rb1 = (args.p.up_offset + block * args.c.cols_per_cta) / kBlockK;
  const float* src =
      args.p.b_scales + static_cast<size_t>(expert) * args.b_row_blocks * args.k_blocks;
  const int rows = args.gated ? kScaleRows : args.c.parts;
#pragma unroll 1
  for (int kb = threadIdx.x; kb < args.k_blocks; kb += kThreads)
#pragma unroll 1
    for (int r = 0; r < rows; ++r) {
      const int rb = !args.gated ? rb0 + r : r == 0 ? rb0 : rb1 + r - 1;
      const bool ok = rb < args.b_row_blocks;
      cp_async_4(b_sm + r * args.k_blocks + kb, src + (ok ? rb * args.k_blocks + kb : 0), ok);
    }
}

// a_sm[kb][i]: the scales of the tile's rows (0 past tile.rows). After
// pdl_begin(); then every thread waits for its copies and the CTA syncs.
__device__ __forceinline__ void stage_a_scales(const Fp8StreamArgs& args, const DeviceTile& tile,
                                               float* a_sm) {
  const Fp8StreamGemmParams& p = args.p;
#pragma unroll 1
  for (int idx = threadIdx.x; idx < kStreamTileM * args.k_blocks; idx += kThreads) {
    const int i = idx % kStreamTileM, kb = idx / kStreamTileM;
    const bool ok = i < tile.rows;
    cp_async_4(a_sm + idx,
               p.a_scales + (ok ? static_cast<size_t>(kb) * p.a_scales_ld +
                                      source_row(p, tile.row_start + i)
                                : 0),
               ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
}

// After the CTA's first weight loads: its share of the next GEMM's weights
// of the tile's expert (p.next; warp 0 the weights, warp 1 their scales).
__device__ __forceinline__ void prefetch_next(const Fp8StreamArgs& args, const DeviceTile& tile,
                                              int block) {
  const Fp8StreamGemmParams& p = args.p;
  if (p.next.base == nullptr || (threadIdx.x & 31) != 0 || threadIdx.x >= 64) return;
  prefetch_next_weights(p.next, *p.num_tiles, tile.expert, block, args.c.n_blocks,
                        threadIdx.x == 32);
}

// The A row of tile row `row` quantized by the CTA (kQuantizeA): the
// raw row copied into shared memory, then its codes to x_sm and its scales
// to a_sm[kb][row] (kernels/quant/fp8_encode.cuh, the quantize kernels'
// rule). After pdl_begin(); completes the B scales' copies too, and ends
// with the CTA synchronized.
__device__ __forceinline__ void quantize_a_row(const Fp8StreamArgs& args, const DeviceTile& tile,
                                               int row, uint8_t* smem, uint8_t* x_sm,
                                               float* a_sm) {
  const Fp8StreamGemmParams& p = args.p;
  const size_t src_row = source_row(p, tile.row_start + row);
  uint8_t* raw = smem + args.raw_offset;
  const int bytes = p.k * (p.a_bf16 != nullptr ? 2 : 4);
  const uint8_t* src = p.a_bf16 != nullptr
                           ? reinterpret_cast<const uint8_t*>(p.a_bf16 + src_row * p.k)
                           : reinterpret_cast<const uint8_t*>(p.a_f32 + src_row * p.k);
#pragma unroll 1
  for (int off = kLaneK * threadIdx.x; off < bytes; off += kLaneK * kThreads)
    cp_async_16(shared_address(raw + off), src + off, kLaneK);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  if (p.a_bf16 != nullptr)
    fp8_encode::quantize_row_shared<kWarps>(reinterpret_cast<const uint16_t*>(raw), p.k, x_sm,
                                            a_sm + row, kStreamTileM, p.a_row_scale,
                                            p.a_given_scale, p.a_maxima);
  else
    fp8_encode::quantize_row_shared<kWarps>(reinterpret_cast<const float*>(raw), p.k, x_sm,
                                            a_sm + row, kStreamTileM, p.a_row_scale,
                                            p.a_given_scale, p.a_maxima);
  if (p.a_scale_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *p.a_scale_out = a_sm[row];
}

// ---- One-token tiles: 16L-byte row pieces per unit, the diagonal of each product.

// This warp's kSlots x kUnits pairs over all of K, kChunks pieces of each in
// flight; slot s of unit u is pair q0 + s * kUnits + u. Row `row` of the
// tile (0 but for a wide CTA's multi-row tiles). Returns the largest |value|
// this thread stored (store_pair).
template <int kSlots, int kChunks, int kUnitLanes, bool kQuantizeA>
__device__ __forceinline__ float stream_one_token(const Fp8StreamArgs& args, const DeviceTile& tile,
                                                 int block, int row, uint8_t* smem, float* a_sm,
                                                 float* b_sm) {
  uint8_t* x_sm = smem;  // the token row's codes
  constexpr int kUnits = 32 / kUnitLanes;
  constexpr int kPiece = kLaneK * kUnitLanes;  // K of one unit load
  const Fp8StreamGemmParams& p = args.p;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, li = lane % kUnitLanes;
  const int pairs = args.gated ? p.n_out : p.n_out / 2;
  const int q_lane = (block * kWarps + warp) * kSlots * kUnits + lane / kUnitLanes;
  const size_t k = p.k;
  const int row0 = args.gated ? q_lane : 2 * q_lane;
  // The B scale row of the warp's gate (or all) rows, whose 128-row block
  // is one: 0, or 1 in a wide CTA's second column block (not gated).
  const int vblock = block * args.c.parts;
  const int first_row = (args.gated ? 1 : 2) * (block * kWarps + warp) * kSlots * kUnits;
  const int lo_scales = (first_row / kBlockK - vblock * args.c.cols_per_cta / kBlockK) * args.k_blocks;
  const uint8_t* r0 = p.b + (static_cast<size_t>(tile.expert) * p.b_rows + row0) * k + kLaneK * li;
  const uint8_t* r1 = r0 + static_cast<size_t>(args.gated ? p.up_offset : 1) * k;
  const size_t slot_stride = static_cast<size_t>(kUnits) * (args.gated ? 1 : 2) * k;

  const int odd = (lane >> 2) & 1;  // the diagonal entries are c[odd] (R0) and c[2 + odd] (R1)
  float d[kSlots][2] = {};
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int k0 = 0; k0 < p.k; k0 += kPiece * kChunks) {
    uint4 w0[kChunks][kSlots], w1[kChunks][kSlots];
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int kc = k0 + c * kPiece;
        const bool load = kc + kLaneK * li < p.k && q_lane + s * kUnits < pairs;
        w0[c][s] = load ? load_weights<false>(r0 + s * slot_stride + kc) : zero;
        w1[c][s] = load ? load_weights<false>(r1 + s * slot_stride + kc) : zero;
      }
    // The first round's weight requests are out; the token row and its
    // scales are the previous kernel's output (or gathered through it).
    if (k0 == 0) {
      if (row == 0) prefetch_next(args, tile, block);
      stage_b_scales(args, tile.expert, vblock, b_sm);
      pdl_begin();
      if constexpr (kQuantizeA) {
        quantize_a_row(args, tile, row, smem, x_sm, a_sm);
      } else {
        const uint8_t* x = p.a + static_cast<size_t>(source_row(p, tile.row_start + row)) * k;
#pragma unroll 1
        for (int off = kLaneK * threadIdx.x; off < p.k; off += kLaneK * kThreads)
          cp_async_16(shared_address(x_sm + off), x + off, kLaneK);
        stage_a_scales(args, tile, a_sm);
      }
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int kc = k0 + c * kPiece;
      if (kc >= p.k) continue;  // warp-uniform: a piece past K
      const int kk = kc + kLaneK * li;
      const uint4 xv = kk < p.k ? *reinterpret_cast<const uint4*>(x_sm + kk) : zero;
      // This lane's block; lanes past K (a ragged last piece) hold zeros.
      const int kb = min(kc / kBlockK + li / 8, args.k_blocks - 1);
      const float a_scale = a_sm[kb * kStreamTileM + row];
      const float scale0 = a_scale * b_sm[lo_scales + kb];
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_load(acc, w0[c][s], w1[c][s], xv);
        const int up_row = up_scale_row(args, vblock, p.up_offset + q_lane + s * kUnits);
        const float scale1 = args.gated ? a_scale * b_sm[up_row * args.k_blocks + kb] : scale0;
        d[s][0] = fmaf(scale0, odd ? acc[1] : acc[0], d[s][0]);
        d[s][1] = fmaf(scale1, odd ? acc[3] : acc[2], d[s][1]);
      }
    }
  }
  if (p.early_dependents) pdl_launch_dependents();

  // Lane (g, t) holds columns 2t and 2t + 1: entry (g, g) when t == g / 2.
  const int g = lane >> 2, t = lane & 3;
  float u[kSlots][2];
#pragma unroll
  for (int s = 0; s < kSlots; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h) u[s][h] = t == g / 2 ? d[s][h] : 0.0f;
  reduce_slots<kSlots, kUnitLanes>(u, lane);
  constexpr int kLanesPerSlot = kUnitLanes / kSlots;
  const int q = q_lane + (li / kLanesPerSlot) * kUnits;
  if (li % kLanesPerSlot != 0 || q >= pairs) return 0.0f;
  return store_pair<kQuantizeA>(args, tile.expert,
                                static_cast<size_t>(tile.row_start + row) * p.n_out,
                                args.gated ? q : 2 * q, args.gated ? p.up_offset + q : 2 * q + 1,
                                u[0][0], u[0][1], true, true);
}

// ---- Multi-row tiles: 16 weight rows x 64 K per slab, kFrags token fragments.

template <int kFrags, int kSlabs>
__device__ __forceinline__ void stream_rows(const Fp8StreamArgs& args, const DeviceTile& tile,
                                            int block, float* a_sm, float* b_sm, float* partial) {
  static_assert((kSlabs * kSlabK) % kBlockK == 0, "whole blocks per round");
  const Fp8StreamGemmParams& p = args.p;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int split = warp % args.c.splits, group = warp / args.c.splits;
  const int col0 = (block * (kWarps / args.c.splits) + group) * (args.gated ? 8 : 16);

  // Fragment rows g and g + 8: weight rows lo and hi.
  const int row_lo = col0 + g;
  const int row_hi = args.gated ? p.up_offset + row_lo : row_lo + 8;
  const bool lo_ok = row_lo < p.n_out;
  const bool hi_ok = args.gated ? lo_ok : row_hi < p.n_out;
  const size_t k = p.k;
  const uint8_t* w = p.b + static_cast<size_t>(tile.expert) * p.b_rows * k + kLaneK * t;
  const uint8_t* w_lo = w + static_cast<size_t>(row_lo) * k;
  const uint8_t* w_hi = w + static_cast<size_t>(row_hi) * k;
  const int hi_scales = args.gated ? up_scale_row(args, block, row_hi) * args.k_blocks : 0;
  const int k_begin = split * args.c.k_chunk;
  const int k_end = min(p.k, k_begin + args.c.k_chunk);

  // Token fragment f holds tile rows 8f..8f+7; this lane loads row 8f + g
  // (its address is known after the wait).
  const uint8_t* x_row[kFrags] = {};
  const bool x_ok[2] = {g < tile.rows, 8 + g < tile.rows};
  float acc[kFrags][4] = {};
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // Every warp runs the first round (masked when its K range is empty):
  // it stages the CTA's scales.
  for (int k0 = k_begin; k0 == k_begin || k0 < k_end; k0 += kSlabs * kSlabK) {
    uint4 wl[kSlabs], wh[kSlabs], xv[kSlabs][kFrags];
#pragma unroll
    for (int u = 0; u < kSlabs; ++u) {  // k_end is a multiple of 128: whole slabs
      const int kk = k0 + u * kSlabK;
      wl[u] = kk < k_end && lo_ok ? load_weights<true>(w_lo + kk) : zero;
      wh[u] = kk < k_end && hi_ok ? load_weights<true>(w_hi + kk) : zero;
    }
    if (k0 == k_begin) {
      prefetch_next(args, tile, block);
      stage_b_scales(args, tile.expert, block, b_sm);
      pdl_begin();
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
        if (x_ok[f])
          x_row[f] = p.a + static_cast<size_t>(source_row(p, tile.row_start + 8 * f + g)) * k +
                     kLaneK * t;
      stage_a_scales(args, tile, a_sm);
    }
#pragma unroll
    for (int u = 0; u < kSlabs; ++u)
#pragma unroll
      for (int f = 0; f < kFrags; ++f) {
        const int kk = k0 + u * kSlabK;
        xv[u][f] =
            kk < k_end && x_ok[f] ? __ldg(reinterpret_cast<const uint4*>(x_row[f] + kk)) : zero;
      }
#pragma unroll
    for (int b = 0; b < kSlabs / kSlabsPerBlock; ++b) {
      const int kb = k0 / kBlockK + b;
      if (kb * kBlockK >= k_end) continue;  // warp-uniform
      float blk[kFrags][4] = {};
#pragma unroll
      for (int u = b * kSlabsPerBlock; u < (b + 1) * kSlabsPerBlock; ++u)
#pragma unroll
        for (int f = 0; f < kFrags; ++f) mma_load(blk[f], wl[u], wh[u], xv[u][f]);
      const float b_lo = b_sm[kb], b_hi = b_sm[hi_scales + kb];
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float a_scale = a_sm[kb * kStreamTileM + 8 * f + 2 * t + j];
          acc[f][j] = fmaf(a_scale * b_lo, blk[f][j], acc[f][j]);
          acc[f][2 + j] = fmaf(a_scale * b_hi, blk[f][2 + j], acc[f][2 + j]);
        }
    }
  }
  if (p.early_dependents) pdl_launch_dependents();

  // ---- K splits meet in shared memory; split 0 adds them in split order.
  if (args.c.splits > 1) {
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int c = 0; c < 4; ++c) partial[(warp * 8 + f * 4 + c) * 32 + lane] = acc[f][c];
    __syncthreads();
    if (split != 0) return;
    for (int s = 1; s < args.c.splits; ++s)
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[f][c] += partial[((warp + s) * 8 + f * 4 + c) * 32 + lane];
  }
  // Lane (g, t) holds rows lo (c0, c1) and hi (c2, c3) of tile rows 8f + 2t + j.
#pragma unroll
  for (int f = 0; f < kFrags; ++f)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      if (8 * f + 2 * t + j < tile.rows)
        store_pair<false>(args, tile.expert,
                   static_cast<size_t>(tile.row_start + 8 * f + 2 * t + j) * p.n_out, row_lo,
                   row_hi, acc[f][j], acc[f][2 + j], lo_ok, hi_ok);
}

// One kernel per one-token shape (unit width, slots; the launcher picks),
// per source of A (its codes and scales, or the raw rows it quantizes:
// kQuantizeA) and with or without the folded finalize (kFold): kernels of
// their own, so that the plain ones keep their register allocation.
template <int kUnitLanes, int kSlots, bool kQuantizeA, bool kFold>
__global__ void __launch_bounds__(kThreads, 2) fp8_stream_gemm_kernel(const Fp8StreamArgs args) {
  static_assert(kSlots * 32 / kUnitLanes <= 2 * kWarps, "at most 16 pairs a warp");
  extern __shared__ __align__(16) uint8_t smem[];  // token row, A scales, B scales
  __shared__ float partial[kWarps * 8 * 32];
  const Fp8StreamGemmParams& p = args.p;
  // With prefetch_before_wait the schedule is older than the previous
  // kernel: read it now, wait before reading A.
  if (!p.prefetch_before_wait) pdl_begin();
  const int tile_index = blockIdx.x / args.c.n_blocks;
  if (tile_index >= *p.num_tiles) {
    if (kQuantizeA && p.out_maxima != nullptr && threadIdx.x == 0) p.out_maxima[blockIdx.x] = 0.0f;
    if (kFold && *p.num_tiles == 0 && blockIdx.x == 0) {
      pdl_begin();
      finalize_device::fold_zeros<kThreads>(p.fold);
    }
    return;
  }
  const DeviceTile tile = p.tiles[tile_index];
  const int block = blockIdx.x - tile_index * args.c.n_blocks;
  float* a_sm = reinterpret_cast<float*>(smem + p.k);
  float* b_sm = a_sm + kStreamTileM * args.k_blocks;
  constexpr int kChunks = kLoadsInFlight / (2 * kSlots);
  // A wide CTA (16 pairs a warp: two column blocks, parts = 2).
  constexpr bool kWide = kSlots * 32 / kUnitLanes > kWarps;
  // Both paths cover the same cols_per_cta columns (a CTA-uniform choice).
  // A wide CTA (parts = 2: its kernel is the only one of 8 slots) serves
  // each row of a rare multi-row tile by the one-token path: wide grids are
  // of a few tiles, one or two tokens. So does a CTA that quantizes A
  // itself (the one-token path is where it does).
  float stored = 0.0f;  // the largest |value| this thread stored (out_maxima)
  if (tile.rows == 1) {
    stored = stream_one_token<kSlots, kChunks, kUnitLanes, kQuantizeA>(args, tile, block, 0, smem,
                                                                      a_sm, b_sm);
  } else if constexpr (kWide || kQuantizeA) {
#pragma unroll 1
    for (int row = 0; row < tile.rows; ++row) {
      if (row > 0) __syncthreads();  // every warp is done with the previous row's staging
      stored = fmaxf(stored, stream_one_token<kSlots, kChunks, kUnitLanes, kQuantizeA>(
                                 args, tile, block, row, smem, a_sm, b_sm));
    }
  } else if (tile.rows <= 8) {  // one token fragment, more slabs in flight
    stream_rows<1, kUnrollOneFragment>(args, tile, block, a_sm, b_sm, partial);
  } else {
    stream_rows<2, kUnroll>(args, tile, block, a_sm, b_sm, partial);
  }
  if constexpr (kQuantizeA) {
    if (p.out_maxima != nullptr) {
      const float m = fp8_amax::block_max<kWarps>(stored);
      if (threadIdx.x == 0) p.out_maxima[blockIdx.x] = m;
    }
  }
  if constexpr (kFold) {
    // Read again here rather than kept in a register through the main loop.
    const int tiles = *p.num_tiles;
    const int fold_block = static_cast<int>(blockIdx.x) % args.c.n_blocks;
    const int first = fold_block * args.c.parts * args.c.cols_per_cta;
    finalize_device::fold_finalize<kThreads>(
        p.fold, fold_block, first, min(p.n_out, first + args.c.parts * args.c.cols_per_cta), tiles);
  }
}

}  // namespace unimoe::fp8_stream
