// The W4A16 stream (swap-AB) grouped GEMM (contract: stream_gemm_w4.cuh).
//
// A CTA of 8 warps serves one tile of the schedule (one expert, up to 16
// or 64 token rows) and cols_per_cta output columns. A warp owns 16 weight rows,
// the MMA's M side: fragment rows g (lo) and g + 8 (hi) of lane (g, t) =
// (lane / 4, lane % 4) are, for a gated GEMM1, gate row c and up row
// up_offset + c of one output column c, else two output columns. With
// `splits` > 1 the CTA's warps split K: warp w takes row group w / splits
// and K range w % splits, and the splits meet in shared memory.
//
// A warp step covers 128 values of K: lane t loads 16 bytes (32 values) of
// each of its two rows at K offset 32t, and that load's block scales (one
// e8m0 for MXFP4, two e4m3 for NVFP4). Each 32-bit word becomes four bf16
// pairs (core/fp4_layout.h: shifts, a lop3 and one bf16 multiply by 2^126
// times the block scale, exact), and the lane's 32 values feed 8 mma.sync
// m16n8k16 steps: the K order inside an mma is free as long as A and B
// agree, so step j takes values 4j..4j+3 of every lane's load, pairs (4j,
// 4j + 1) as A/B registers 0 and (4j + 2, 4j + 3) as registers 1 / 2. The
// token rows (B, bf16) are read with the same order: lane (g, t) reads 64
// bytes of token row g at K offset 32t.
//
// The block scale is applied to the weights before the MMA (exact in bf16
// for every finite code: an e2m1 value times a power of two, or times an
// e4m3 scale times 2^-9 for NVFP4, whose matrix scale times 2^9 scales the
// fp32 sum), so one fp32 accumulator runs over the whole K range.
// MXFP4 codes above 128 (scales of 2 and more) take a second multiply,
// since 2^126 times their scale is not a bf16; code 255 (NaN) gives NaN.
//
// Two forms here, by the schedule's M tile (W4StreamGemmParams::tile_m),
// and a third, tile_m 128, in sm90_w4_wgmma_gemm.cu:
// - 16 rows: weights loaded straight into a ring of registers, a few steps
//   in flight (run_tile: each slot refilled right after its math, or, the
//   earlier form, a round of steps loaded and then multiplied). A one-row
//   tile (decode: most tiles) stages its row in shared memory once, and
//   every warp reads it there; larger tiles read their rows from global
//   memory (L1/L2) per step, kFrags n8 fragments (8 or 16 rows).
// - 64 rows (the rows form, below): the CTA stages the tile's token rows in
//   shared memory step by step, and each warp takes all of K.
//
// PDL as the other stream kernels: with prefetch_before_wait (GEMM2, whose
// schedule and weights are older than the kernel ahead of it) the 16-row
// form reads its tile and issues its first weight loads before
// pdl_begin(); otherwise it waits first. Token rows are read after the
// wait.
#include "kernels/gemm/stream_gemm_w4.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/fp4_layout.h"
#include "kernels/common/common.cuh"
#include "kernels/epilogue/finalize_device.cuh"
#include "kernels/gemm/sm90_w4_wgmma_gemm.cuh"
#include "kernels/gemm/stream_gemm.cuh"
#include "kernels/gemm/w4_dequant.cuh"

namespace unimoe {
namespace w4_stream {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kLaneK = 32;           // K values of one lane's 16-byte load
constexpr int kStepK = 4 * kLaneK;   // K values of one warp step
constexpr int kMinKPerSplit = 512;
constexpr int kStepsOneRow = 4;      // steps in flight: one-row tiles (token row in shared memory)
constexpr int kStepsRows = 2;        // the same for larger tiles (token rows in registers)
// The rows form (tile_m = kRowsTileM): kRowsStages steps of the tile's token
// rows (kRowsTileM x kStepK bf16, 16 KB) and of each thread's weights in a
// ring; every warp covers 16 weight rows over all of K (no K split).
constexpr int kRowsTileM = w4_rows_tile_m;
constexpr int kRowsStages = 3;
constexpr int kXStageBytes = kRowsTileM * kStepK * 2;
static_assert(kStreamTileM == 16, "two n8 token fragments per tile");

struct Args {
  W4StreamGemmParams p;
  int splits = 1;
  int k_chunk = 0;       // K per split, a multiple of kStepK (the last split may end early)
  int cols_per_cta = 0;
  int n_blocks = 0;
  int scale_stride = 0;  // scale bytes from one B row to the next
  bool gated = false;
  bool rows_form = false;  // tiles of up to kRowsTileM rows: token rows staged by the CTA
};

// cp.async of 16 code bytes (L2 fetches the whole 128-byte line, as the
// loads above) and of a 4-byte scale word; `ok` false writes zeros.
__device__ __forceinline__ void copy_codes(void* smem, const uint8_t* src, bool ok) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(smem))),
               "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void copy_word(void* smem, const uint8_t* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(smem))),
               "l"(src), "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// acc += the 8 mma steps of one lane load pair against one token fragment.
__device__ __forceinline__ void mma_fragment(float (&acc)[4], const uint32_t (&lo)[16],
                                             const uint32_t (&hi)[16], const uint4 (&x)[4]) {
  const uint32_t xw[16] = {x[0].x, x[0].y, x[0].z, x[0].w, x[1].x, x[1].y, x[1].z, x[1].w,
                           x[2].x, x[2].y, x[2].z, x[2].w, x[3].x, x[3].y, x[3].z, x[3].w};
#pragma unroll
  for (int j = 0; j < 8; ++j)
    mma16816(acc, lo[2 * j], hi[2 * j], lo[2 * j + 1], hi[2 * j + 1], xw[2 * j], xw[2 * j + 1]);
}

// acc[f] += the same against token fragment f.
template <int kFrags>
__device__ __forceinline__ void mma_load(float (&acc)[kFrags][4], const uint32_t (&lo)[16],
                                         const uint32_t (&hi)[16], const uint4 (&x)[kFrags][4]) {
#pragma unroll
  for (int f = 0; f < kFrags; ++f) mma_fragment(acc[f], lo, hi, x[f]);
}

__device__ __forceinline__ int source_row(const W4StreamGemmParams& p, int permuted_row) {
  return p.gather != nullptr ? p.gather[permuted_row] / p.top_k : permuted_row;
}

// One warp's place in a tile: its two weight rows per lane (fragment rows g
// and g + 8), their code and scale pointers at K = 0, and its K range.
struct WarpRows {
  int lane, warp, g, t, split;
  int row_lo, row_hi;
  bool lo_ok, hi_ok;
  size_t expert_row;
  const uint8_t* w_lo;  // this lane's 16 bytes of row lo at K = 0 (offset 16t)
  const uint8_t* w_hi;
  const uint8_t* s_lo;  // row lo's scales
  const uint8_t* s_hi;
  int k_begin, k_end;
};

__device__ __forceinline__ WarpRows warp_rows(const Args& a, const DeviceTile& tile, int block) {
  const W4StreamGemmParams& p = a.p;
  WarpRows r;
  r.lane = threadIdx.x & 31;
  r.warp = threadIdx.x >> 5;
  r.g = r.lane >> 2;
  r.t = r.lane & 3;
  r.split = r.warp % a.splits;
  const int group = r.warp / a.splits;
  const int col0 = (block * (kWarps / a.splits) + group) * (a.gated ? 8 : 16);
  r.row_lo = col0 + r.g;
  r.row_hi = a.gated ? p.up_offset + r.row_lo : r.row_lo + 8;
  r.lo_ok = r.row_lo < p.n_out;
  r.hi_ok = a.gated ? r.lo_ok : r.row_hi < p.n_out;
  const size_t row_bytes = static_cast<size_t>(p.k) / 2;
  r.expert_row = static_cast<size_t>(tile.expert) * p.b_rows;
  r.w_lo = p.b + (r.expert_row + r.row_lo) * row_bytes + 16 * r.t;
  r.w_hi = p.b + (r.expert_row + r.row_hi) * row_bytes + 16 * r.t;
  r.s_lo = p.b_scales + (r.expert_row + r.row_lo) * a.scale_stride;
  r.s_hi = p.b_scales + (r.expert_row + r.row_hi) * a.scale_stride;
  r.k_begin = r.split * a.k_chunk;
  r.k_end = min(p.k, r.k_begin + a.k_chunk);
  return r;
}

// After the first weight requests are out: wait for the previous kernel,
// then stage a one-row tile's token row in x_sm (every thread of the CTA
// takes part) or point x_row at this lane's token rows.
template <int kFrags, bool kSmemRow>
__device__ __forceinline__ void token_rows(const W4StreamGemmParams& p, const DeviceTile& tile,
                                           int g, uint16_t* x_sm,
                                           const uint16_t* (&x_row)[kFrags]) {
  pdl_begin();
  if constexpr (kSmemRow) {
    const uint16_t* x = p.a + static_cast<size_t>(source_row(p, tile.row_start)) * p.k;
#pragma unroll 1
    for (int off = 8 * threadIdx.x; off < p.k; off += 8 * kThreads)
      *reinterpret_cast<uint4*>(x_sm + off) = __ldg(reinterpret_cast<const uint4*>(x + off));
    __syncthreads();
  } else {
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
      if (8 * f + g < tile.rows)
        x_row[f] = p.a + static_cast<size_t>(source_row(p, tile.row_start + 8 * f + g)) * p.k;
  }
}

// The token values of one lane load (K from kk, 32 values) for each fragment.
template <int kFrags, bool kSmemRow>
__device__ __forceinline__ void token_values(const uint16_t* x_sm,
                                             const uint16_t* const (&x_row)[kFrags], int kk,
                                             int k_end, uint4 (&xv)[kFrags][4]) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int f = 0; f < kFrags; ++f)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if constexpr (kSmemRow)
        xv[f][q] = kk < k_end ? reinterpret_cast<const uint4*>(x_sm + kk)[q] : zero;
      else
        xv[f][q] = kk < k_end && x_row[f] != nullptr
                       ? __ldg(reinterpret_cast<const uint4*>(x_row[f] + kk) + q)
                       : zero;
    }
}

// K splits meet in shared memory (split 0 adds them in split order), then
// the epilogue. Lane (g, t) holds weight rows lo (c0, c1) and hi (c2, c3)
// of token rows 8f + 2t + j.
template <int kFrags>
__device__ __forceinline__ void finish_tile(const Args& a, const DeviceTile& tile,
                                            const WarpRows& r, float (&acc)[kFrags][4],
                                            float* partial) {
  const W4StreamGemmParams& p = a.p;
  if (p.early_dependents) pdl_launch_dependents();
  if (a.splits > 1) {
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int c = 0; c < 4; ++c) partial[(r.warp * 8 + f * 4 + c) * 32 + r.lane] = acc[f][c];
    __syncthreads();
    if (r.split != 0) return;
    for (int s = 1; s < a.splits; ++s)
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          acc[f][c] += partial[((r.warp + s) * 8 + f * 4 + c) * 32 + r.lane];
  }
  const float global =
      p.b_global != nullptr ? p.b_global[tile.expert] * 0x1p9f : 1.0f;  // NVFP4: undo the 2^-9
  const float* bias = p.bias != nullptr ? p.bias + r.expert_row : nullptr;
  const float b_lo = bias != nullptr && r.lo_ok ? bias[r.row_lo] : 0.0f;
  const float b_hi = bias != nullptr && r.hi_ok ? bias[r.row_hi] : 0.0f;
#pragma unroll
  for (int f = 0; f < kFrags; ++f)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = 8 * f + 2 * r.t + j;
      if (row >= tile.rows) continue;
      uint16_t* out = p.out + static_cast<size_t>(tile.row_start + row) * p.n_out;
      const float v_lo = fmaf(acc[f][j], global, b_lo);
      const float v_hi = fmaf(acc[f][2 + j], global, b_hi);
      if (a.gated) {
        if (r.lo_ok)
          out[r.row_lo] = __bfloat16_as_ushort(
              __float2bfloat16_rn(gated_activation(p.epilogue, v_lo, v_hi, p.alpha, p.limit)));
      } else {
        if (r.lo_ok)
          out[r.row_lo] =
              __bfloat16_as_ushort(__float2bfloat16_rn(pointwise_activation(p.epilogue, v_lo)));
        if (r.hi_ok)
          out[r.row_hi] =
              __bfloat16_as_ushort(__float2bfloat16_rn(pointwise_activation(p.epilogue, v_hi)));
      }
    }
}

// The register form: a ring of kSteps steps of weight loads in registers.
// kPipelined: the slot a step's math has just used is refilled at once with
// the step kSteps later, so that kSteps - 1 to kSteps steps stay in flight
// while the warp dequantizes and multiplies; otherwise (the earlier form)
// the warp loads kSteps steps, waits for them, does their math, and only
// then loads the next kSteps. kFrags token fragments; kSmemRow: the tile
// has one row, staged in x_sm.
template <int kFrags, int kSteps, bool kSmemRow, bool kPipelined>
__device__ __forceinline__ void run_tile(const Args& a, const DeviceTile& tile, int block,
                                         uint16_t* x_sm, float* partial) {
  const W4StreamGemmParams& p = a.p;
  const WarpRows r = warp_rows(a, tile, block);
  const int block_values = w4_block_values(p.format);
  const int scale_lane = kLaneK / block_values * r.t;  // this lane's first scale of a step
  const int scales_per_step = kStepK / block_values;   // scale bytes of a row per step

  const uint16_t* x_row[kFrags] = {};
  float acc[kFrags][4] = {};
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 wl[kSteps], wh[kSteps];
  uint32_t sl[kSteps], sh[kSteps];
  // Slot u <- the step at K = ks (zeros past the warp's K range).
  const auto load = [&](int u, int ks) {
    const bool in = ks + kLaneK * r.t < r.k_end;  // this lane's values start at ks + 32t
    const size_t byte = static_cast<size_t>(ks) / 2;
    const int scale = ks / kStepK * scales_per_step + scale_lane;
    wl[u] = in && r.lo_ok ? w4::load_codes(r.w_lo + byte) : zero;
    wh[u] = in && r.hi_ok ? w4::load_codes(r.w_hi + byte) : zero;
    sl[u] = in && r.lo_ok ? w4::load_scales(p.format, r.s_lo + scale) : 0u;
    sh[u] = in && r.hi_ok ? w4::load_scales(p.format, r.s_hi + scale) : 0u;
  };
  // The math of slot u, the step at K = ks.
  const auto math = [&](int u, int ks) {
    uint4 xv[kFrags][4];
    token_values<kFrags, kSmemRow>(x_sm, x_row, ks + kLaneK * r.t, r.k_end, xv);
    uint32_t dlo[16], dhi[16];
    w4::dequantize(p.format, wl[u], sl[u], dlo);
    w4::dequantize(p.format, wh[u], sh[u], dhi);
    mma_load<kFrags>(acc, dlo, dhi, xv);
  };
  if constexpr (kPipelined) {
#pragma unroll
    for (int u = 0; u < kSteps; ++u) load(u, r.k_begin + u * kStepK);
    // Every warp stages (even one whose K range is empty): the token row
    // is the whole CTA's.
    token_rows<kFrags, kSmemRow>(p, tile, r.g, x_sm, x_row);
#pragma unroll 1
    for (int k0 = r.k_begin; k0 < r.k_end; k0 += kSteps * kStepK) {
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
        const int ks = k0 + u * kStepK;
        if (ks >= r.k_end) break;  // warp-uniform
        math(u, ks);
        const int next = ks + kSteps * kStepK;
        if (next < r.k_end) load(u, next);
      }
    }
  } else {
    // Every warp runs the first round (masked when its K range is empty):
    // it takes part in staging the token row.
    for (int k0 = r.k_begin; k0 == r.k_begin || k0 < r.k_end; k0 += kSteps * kStepK) {
#pragma unroll
      for (int u = 0; u < kSteps; ++u) load(u, k0 + u * kStepK);
      if (k0 == r.k_begin) token_rows<kFrags, kSmemRow>(p, tile, r.g, x_sm, x_row);
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
        if (k0 + u * kStepK >= r.k_end) break;  // warp-uniform
        math(u, k0 + u * kStepK);
      }
    }
  }
  finish_tile<kFrags>(a, tile, r, acc, partial);
}

// ---- The rows form: tiles of up to 64 token rows -------------------------
//
// At 16 rows an expert and more, reading the token rows from L1 per warp
// (8 warps, each 4 x 16 bytes a fragment and step for 1 KB of weights)
// costs more than the weights. Here the CTA stages each 128-wide K step of
// the tile's rows in shared memory once (cp.async, 16 KB), and every warp
// reads its fragments there: the weights a warp dequantizes are used for
// every fragment of the tile (up to 8), so a byte of weights feeds up to 64
// token rows. Measured on an H100 against the 16-row form, whole layer
// (MXFP4): T=512 gpt-oss-120b 1153.7 against 1860.0 us, qwen3-30b-a3b
// 338.0 against 620.7, dsv3-tp8 638.7 against 864.6; layer_plan.cpp has the
// rule.
//
// Each thread also copies its own weights of a step with cp.async: its two
// 16-byte code pieces (rows lo and hi) and, per row, the 4-byte word of the
// step's scales that holds its own (MXFP4: bytes ks / 32 + 0..3, one a
// lane; NVFP4: the word at ks / 16 + 4 (t / 2), two bytes a lane; the
// prepared scale rows are padded to 8 bytes). A step's copies (weights and
// token rows) are one cp.async group; kRowsStages steps are in flight, and
// one barrier a step both publishes the step's token rows and frees the
// slot of the step before for the next copies.
//
// A row's step is 16 chunks of 16 bytes; chunk c of row r sits at 16-byte
// slot c ^ ((c >> 3) << 1) ^ (r & 1). A quarter warp reads chunks q, q + 4,
// q + 8, q + 12 of two neighbouring rows (lanes (g, t), t = 0..3, for two
// g), which this puts in 8 distinct bank groups.
__device__ __forceinline__ int rows_slot(int r, int c) { return c ^ ((c >> 3) << 1) ^ (r & 1); }

template <int kFrags>
__device__ __forceinline__ void run_rows_tile(const Args& a, const DeviceTile& tile, int block,
                                              char* smem) {
  const W4StreamGemmParams& p = a.p;
  const WarpRows r = warp_rows(a, tile, block);  // splits = 1: every warp covers all of K
  const bool mx = p.format == W4Format::MXFP4;
  const int word_lane = mx ? 0 : 4 * (r.t >> 1);
  const int step_scale_bytes = mx ? 4 : 8;
  const int steps = (p.k + kStepK - 1) / kStepK;
  const int tid = threadIdx.x;
  char* x_ring = smem;
  uint4* ring_codes = reinterpret_cast<uint4*>(smem + kRowsStages * kXStageBytes);
  uint32_t* ring_scales = reinterpret_cast<uint32_t*>(ring_codes + 2 * kRowsStages * kThreads);

  // The token rows this thread copies: chunk tid % 16 of rows tid / 16 + 16i.
  constexpr int kRowsPerPass = kThreads / 16;
  const int chunk = tid % 16;
  const uint16_t* x_src[kRowsTileM / kRowsPerPass];
  const auto issue = [&](int step) {
    if (step < steps) {
      const int ks = step * kStepK;
      const int slot = step % kRowsStages;
      // Weights: zeros past K and past the matrix's rows.
      const bool in = ks + kLaneK * r.t < p.k;
      const size_t byte = static_cast<size_t>(ks) / 2;
      const bool lo = in && r.lo_ok, hi = in && r.hi_ok;
      copy_codes(ring_codes + (2 * slot) * kThreads + tid, lo ? r.w_lo + byte : p.b, lo);
      copy_codes(ring_codes + (2 * slot + 1) * kThreads + tid, hi ? r.w_hi + byte : p.b, hi);
      copy_word(ring_scales + (2 * slot) * kThreads + tid,
                lo ? r.s_lo + ks / kStepK * step_scale_bytes + word_lane : p.b_scales, lo);
      copy_word(ring_scales + (2 * slot + 1) * kThreads + tid,
                hi ? r.s_hi + ks / kStepK * step_scale_bytes + word_lane : p.b_scales, hi);
      // Token rows: zeros past the tile's rows and past K.
      const int kc = ks + 8 * chunk;
      char* stage = x_ring + slot * kXStageBytes;
#pragma unroll
      for (int i = 0; i < kRowsTileM / kRowsPerPass; ++i) {
        const int row = tid / 16 + kRowsPerPass * i;
        const bool ok = x_src[i] != nullptr && kc < p.k;
        copy_codes(stage + row * (kStepK * 2) + rows_slot(row, chunk) * 16,
                   reinterpret_cast<const uint8_t*>(ok ? x_src[i] + kc : p.a), ok);
      }
    }
    copy_commit();
  };

  // The token rows are the previous kernel's output (or gathered through
  // its permutation): wait first, then copy.
  pdl_begin();
#pragma unroll
  for (int i = 0; i < kRowsTileM / kRowsPerPass; ++i) {
    const int row = tid / 16 + kRowsPerPass * i;
    x_src[i] = row < tile.rows
                   ? p.a + static_cast<size_t>(source_row(p, tile.row_start + row)) * p.k
                   : nullptr;
  }
#pragma unroll
  for (int s = 0; s < kRowsStages - 1; ++s) issue(s);

  float acc[kFrags][4] = {};
  const int scale_shift = mx ? 8 * r.t : 16 * (r.t & 1);
  const uint32_t scale_mask = mx ? 0xffu : 0xffffu;
#pragma unroll 1
  for (int step = 0; step < steps; ++step) {
    // This thread's copies of `step` are done; after the barrier, everyone's
    // are, and every warp is past the math of step - 1, whose slot the
    // next issue refills.
    copy_wait<kRowsStages - 2>();
    __syncthreads();
    issue(step + kRowsStages - 1);
    const int slot = step % kRowsStages;
    const bool in = step * kStepK + kLaneK * r.t < p.k;
    const uint4 wl = ring_codes[(2 * slot) * kThreads + tid];
    const uint4 wh = ring_codes[(2 * slot + 1) * kThreads + tid];
    const uint32_t sl = in ? (ring_scales[(2 * slot) * kThreads + tid] >> scale_shift) & scale_mask : 0u;
    const uint32_t sh = in ? (ring_scales[(2 * slot + 1) * kThreads + tid] >> scale_shift) & scale_mask : 0u;
    uint32_t dlo[16], dhi[16];
    w4::dequantize(a.p.format, wl, sl, dlo);
    w4::dequantize(a.p.format, wh, sh, dhi);
    const char* stage = x_ring + slot * kXStageBytes;
#pragma unroll
    for (int f = 0; f < kFrags; ++f) {
      const int row = 8 * f + r.g;
      uint4 xv[4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        xv[q] = *reinterpret_cast<const uint4*>(stage + row * (kStepK * 2) +
                                                rows_slot(row, 4 * r.t + q) * 16);
      mma_fragment(acc[f], dlo, dhi, xv);
    }
  }
  copy_wait<0>();
  finish_tile<kFrags>(a, tile, r, acc, nullptr);
}

// One kernel per form (kForm: 1 the 16-row form, kRowsTileM the rows
// form; kPipelined: the 16-row form's load ring; kFold: the 16-row form
// with the folded finalize), so that each gets its own register allocation.
template <int kForm, bool kPipelined, bool kFold>
__global__ void __launch_bounds__(kThreads, 2) w4_stream_gemm_kernel(const Args a) {
  static_assert(!kFold || kForm == 1, "the fold is the 16-row form's");
  // A one-row tile's token row, or the rows form's token and weight rings.
  extern __shared__ __align__(16) char smem[];
  const W4StreamGemmParams& p = a.p;
  if (!p.prefetch_before_wait) pdl_begin();
  const int tile_index = blockIdx.x / a.n_blocks;
  if (tile_index >= *p.num_tiles) {
    if (kFold && *p.num_tiles == 0 && blockIdx.x == 0) {
      pdl_begin();
      finalize_device::fold_zeros<kThreads>(p.fold);
    }
    return;
  }
  const DeviceTile tile = p.tiles[tile_index];
  const int block = blockIdx.x - tile_index * a.n_blocks;
  if constexpr (kForm == kRowsTileM) {
    if (tile.rows <= 8) run_rows_tile<1>(a, tile, block, smem);
    else if (tile.rows <= 16) run_rows_tile<2>(a, tile, block, smem);
    else if (tile.rows <= 32) run_rows_tile<4>(a, tile, block, smem);
    else run_rows_tile<8>(a, tile, block, smem);
  } else {
    __shared__ float partial[kWarps * 8 * 32];
    uint16_t* x_sm = reinterpret_cast<uint16_t*>(smem);
    if (tile.rows == 1)
      run_tile<1, kStepsOneRow, true, kPipelined>(a, tile, block, x_sm, partial);
    else if (tile.rows <= 8)
      run_tile<1, kStepsRows, false, kPipelined>(a, tile, block, x_sm, partial);
    else
      run_tile<2, kStepsRows, false, kPipelined>(a, tile, block, x_sm, partial);
  }
  if constexpr (kFold) {
    // Read again here rather than kept in a register through the main loop.
    const int tiles = *p.num_tiles;
    const int fold_block = static_cast<int>(blockIdx.x) % a.n_blocks;
    const int first = fold_block * a.cols_per_cta;
    finalize_device::fold_finalize<kThreads>(p.fold, fold_block, first,
                                             min(p.n_out, first + a.cols_per_cta), tiles);
  }
}

using W4Kernel = void (*)(Args);
W4Kernel kernel_for(const Args& a) {
  if (a.rows_form) return w4_stream_gemm_kernel<kRowsTileM, false, false>;
  if (a.p.fold.counters != nullptr)
    return a.p.pipelined ? w4_stream_gemm_kernel<1, true, true> : w4_stream_gemm_kernel<1, false, true>;
  return a.p.pipelined ? w4_stream_gemm_kernel<1, true, false> : w4_stream_gemm_kernel<1, false, false>;
}

void require(bool ok, const std::string& field, const std::string& rule) {
  if (!ok) throw std::invalid_argument("launch_w4_stream_gemm: " + field + " " + rule);
}

bool aligned(const void* q, size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(q) % bytes == 0;
}

void validate(const W4StreamGemmParams& p) {
  const auto is = [](long long v) { return "is " + std::to_string(v) + "; "; };
  const int format = static_cast<int>(p.format);
  require(format == 0 || format == 1, "format", is(format) + "not a W4Format");
  require(p.k > 0 && p.k % kLaneK == 0, "k", is(p.k) + "must be a positive multiple of 32");
  require(p.n_out > 0 && p.n_out % 8 == 0, "n_out", is(p.n_out) + "must be a positive multiple of 8");
  const int epilogue = static_cast<int>(p.epilogue);
  require(epilogue >= 0 && epilogue <= static_cast<int>(GemmEpilogue::ReLU2), "epilogue",
          is(epilogue) + "not a GemmEpilogue");
  require(p.n_out <= p.b_rows, "b_rows", is(p.b_rows) + "must be >= n_out");
  const bool up_ok = p.up_offset >= 0 && static_cast<long long>(p.up_offset) + p.n_out <= p.b_rows;
  require(!is_gated(p.epilogue) || up_ok, "up_offset",
          is(p.up_offset) + "the up rows [up_offset, up_offset + n_out) must be B rows");
  require(p.max_tiles >= 0, "max_tiles", is(p.max_tiles) + "must be >= 0");
  require(p.tile_m == kStreamTileM || p.tile_m == kRowsTileM || p.tile_m == w4_wgmma_tile_m, "tile_m",
          is(p.tile_m) + "allowed: " + std::to_string(kStreamTileM) + ", " + std::to_string(kRowsTileM) +
              " or " + std::to_string(w4_wgmma_tile_m));
  require(p.scale_stride == 0 || p.scale_stride >= p.k / w4_block_values(p.format),
          "scale_stride", is(p.scale_stride) + "must be 0 or at least k / block");
  require(p.gather == nullptr || p.top_k >= 1, "top_k", is(p.top_k) + "must be >= 1");
  require((p.format == W4Format::NVFP4) == (p.b_global != nullptr), "b_global",
          "must be set for NVFP4 and only for NVFP4");
  require(p.fold.counters == nullptr || p.tile_m == kStreamTileM, "fold",
          "is the 16-row form's (tile_m " + std::to_string(kStreamTileM) + "), not tile_m " +
              std::to_string(p.tile_m) + "'s");
  require(p.fold.counters == nullptr || finalize_fold_valid(p.fold, p.out, p.n_out), "fold",
          "needs out = fold.finalize.y, hidden = n_out (a multiple of 8), top_k 1..32 and its "
          "routing pointers and out");
  const struct {
    const void* ptr;
    const char* name;
    size_t align;
    bool required;
  } pointers[] = {{p.a, "a", 16, true},           {p.gather, "gather", 4, false},
                  {p.b, "b", 16, true},           {p.b_scales, "b_scales", 2, true},
                  {p.b_global, "b_global", 4, false}, {p.bias, "bias", 4, false},
                  {p.tiles, "tiles", 4, true},    {p.num_tiles, "num_tiles", 4, true},
                  {p.out, "out", 2, true}};
  for (const auto& q : pointers)
    require((q.ptr != nullptr || !q.required) && aligned(q.ptr, q.align), q.name,
            std::string(q.required ? "must be non-null and " : "must be ") +
                std::to_string(q.align) + "-byte aligned");
}

}  // namespace
}  // namespace w4_stream

int w4_stream_splits(int k) {
  int splits = 1;
  while (splits < w4_stream::kWarps && k >= w4_stream::kMinKPerSplit * 2 * splits) splits *= 2;
  return splits;
}

void launch_w4_stream_gemm(const W4StreamGemmParams& p, KernelStream stream) {
  using namespace w4_stream;
  validate(p);
  if (p.max_tiles == 0) return;
  if (p.tile_m == w4_wgmma_tile_m) {
    launch_w4_wgmma_gemm(p, p.scale_stride != 0 ? p.scale_stride : p.k / w4_block_values(p.format), stream);
    return;
  }
  Args a;
  a.p = p;
  a.gated = is_gated(p.epilogue);
  a.rows_form = p.tile_m == w4_stream::kRowsTileM;
  a.splits = a.rows_form ? 1 : w4_stream_splits(p.k);
  const int per_split = (p.k + a.splits - 1) / a.splits;
  a.k_chunk = (per_split + kStepK - 1) / kStepK * kStepK;
  a.cols_per_cta = kWarps / a.splits * (a.gated ? 8 : 16);
  a.n_blocks = ceil_div(p.n_out, a.cols_per_cta);
  const int scales_per_row = p.k / w4_block_values(p.format);
  a.scale_stride = p.scale_stride != 0 ? p.scale_stride : scales_per_row;
  require(!a.rows_form || a.scale_stride % w4_scale_stride_multiple == 0, "scale_stride",
          "is " + std::to_string(a.scale_stride) + "; the rows form (tile_m " +
              std::to_string(kRowsTileM) + ") needs a multiple of " +
              std::to_string(w4_scale_stride_multiple));
  const long long blocks = static_cast<long long>(p.max_tiles) * a.n_blocks;
  require(blocks <= INT_MAX, "max_tiles",
          "x column blocks = " + std::to_string(blocks) + " exceeds the grid limit");
  // The 16-row form: a one-row tile's token row. The rows form: its token
  // ring, then per stage and thread two 16-byte code pieces and two scale
  // words.
  const size_t smem =
      a.rows_form ? static_cast<size_t>(kRowsStages) * (kXStageBytes + 2 * kThreads * (16 + 4))
                  : static_cast<size_t>(p.k) * sizeof(uint16_t);
  const W4Kernel kernel = kernel_for(a);
  // Past 48 KB of dynamic and static shared memory together (the 16-row
  // form's K-split partials are static, and the folded finalize's flag:
  // 256 bytes covers it) a kernel must opt in.
  const size_t static_smem = a.rows_form ? 0 : sizeof(float) * kWarps * 8 * 32 + 256;
  if (smem + static_smem > 48 * 1024)
    UNIMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  launch_pdl(kernel, static_cast<unsigned>(blocks), kThreads, smem, stream, a);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
