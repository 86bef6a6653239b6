// The W4A16 stream (swap-AB) grouped GEMM (contract: stream_gemm_w4.cuh).
//
// A CTA of 8 warps serves one tile of the schedule (one expert, up to 16
// token rows) and cols_per_cta output columns. A warp owns 16 weight rows,
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
// Token rows: a one-row tile (decode: most tiles) stages its row in shared
// memory once, and every warp reads it there; larger tiles read their rows
// from global memory (L1/L2) per step, kFrags n8 fragments (8 or 16 rows).
//
// PDL as the other stream kernels: with prefetch_before_wait (GEMM2, whose
// schedule and weights are older than the kernel ahead of it) the CTA
// reads its tile and issues its first weight loads before pdl_begin();
// otherwise it waits first. Token rows are read after the wait.
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
#include "kernels/gemm/stream_gemm.cuh"

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
constexpr uint32_t kNegZero2 = 0x80008000u;  // bf16x2 (-0, -0): a * b + -0 is a * b exactly
static_assert(kStreamTileM == 16, "two n8 token fragments per tile");

struct Args {
  W4StreamGemmParams p;
  int splits = 1;
  int k_chunk = 0;       // K per split, a multiple of kStepK (the last split may end early)
  int cols_per_cta = 0;
  int n_blocks = 0;
  int scales_per_row = 0;  // k / block
  bool gated = false;
};

__device__ __forceinline__ uint4 load_weights(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(kNegZero2));
  return d;
}

__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t broadcast_bf16(uint32_t bits) { return bits | bits << 16; }

// The block scales of one lane load: MXFP4 one e8m0 code, NVFP4 two e4m3
// codes (low byte: values 0..15, high byte: 16..31).
__device__ __forceinline__ uint32_t load_scales(const Args& a, const uint8_t* p) {
  if (a.p.format == W4Format::MXFP4) return __ldg(p);
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}

// e4m3 code -> bf16 bits of its value times 2^117 (exact: at most 448 *
// 2^117 < 2^126, at least 2^-9 * 2^117).
__device__ __forceinline__ uint32_t nv_factor(uint32_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  const float f = __half2float(__half(h)) * 0x1p117f;
  return broadcast_bf16(__bfloat16_as_ushort(__float2bfloat16_rn(f)));
}

// 32 values of one row (a 16-byte load) -> 16 bf16 pairs d[m] = values (2m, 2m + 1).
__device__ __forceinline__ void dequantize(const Args& a, const uint4& w, uint32_t scales,
                                           uint32_t (&d)[16]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  if (a.p.format == W4Format::MXFP4) {
    const uint32_t f = broadcast_bf16((min(scales, 128u) + 126u) << 7);  // 2^(min(c, 128) - 1)
#pragma unroll
    for (int m = 0; m < 16; ++m) d[m] = bf16x2_mul(fp4_pair_bits(words[m / 4], m % 4), f);
    if (scales > 128u) {  // rare: scales of 2 and more, or NaN
      const uint32_t f2 = broadcast_bf16(scales == 255u ? 0x7FC0u : (scales - 1u) << 7);
#pragma unroll
      for (int m = 0; m < 16; ++m) d[m] = bf16x2_mul(d[m], f2);
    }
  } else {
    const uint32_t f0 = nv_factor(scales & 0xffu), f1 = nv_factor(scales >> 8);
#pragma unroll
    for (int m = 0; m < 16; ++m)
      d[m] = bf16x2_mul(fp4_pair_bits(words[m / 4], m % 4), m < 8 ? f0 : f1);
  }
}

// acc[f] += the 8 mma steps of one lane load pair against token fragment f.
template <int kFrags>
__device__ __forceinline__ void mma_load(float (&acc)[kFrags][4], const uint32_t (&lo)[16],
                                         const uint32_t (&hi)[16], const uint4 (&x)[kFrags][4]) {
#pragma unroll
  for (int f = 0; f < kFrags; ++f) {
    const uint32_t xw[16] = {x[f][0].x, x[f][0].y, x[f][0].z, x[f][0].w, x[f][1].x, x[f][1].y,
                             x[f][1].z, x[f][1].w, x[f][2].x, x[f][2].y, x[f][2].z, x[f][2].w,
                             x[f][3].x, x[f][3].y, x[f][3].z, x[f][3].w};
#pragma unroll
    for (int j = 0; j < 8; ++j)
      mma16816(acc[f], lo[2 * j], hi[2 * j], lo[2 * j + 1], hi[2 * j + 1], xw[2 * j], xw[2 * j + 1]);
  }
}

__device__ __forceinline__ int source_row(const W4StreamGemmParams& p, int permuted_row) {
  return p.gather != nullptr ? p.gather[permuted_row] / p.top_k : permuted_row;
}

// kFrags token fragments; kSmemRow: the tile has one row, staged in x_sm.
template <int kFrags, int kSteps, bool kSmemRow>
__device__ __forceinline__ void run_tile(const Args& a, const DeviceTile& tile, int block,
                                         uint16_t* x_sm, float* partial) {
  const W4StreamGemmParams& p = a.p;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int split = warp % a.splits, group = warp / a.splits;
  const int col0 = (block * (kWarps / a.splits) + group) * (a.gated ? 8 : 16);
  const int row_lo = col0 + g;
  const int row_hi = a.gated ? p.up_offset + row_lo : row_lo + 8;
  const bool lo_ok = row_lo < p.n_out;
  const bool hi_ok = a.gated ? lo_ok : row_hi < p.n_out;
  const int block_values = w4_block_values(p.format);
  const size_t row_bytes = static_cast<size_t>(p.k) / 2;
  const size_t expert_row = static_cast<size_t>(tile.expert) * p.b_rows;
  const uint8_t* w_lo = p.b + (expert_row + row_lo) * row_bytes + 16 * t;
  const uint8_t* w_hi = p.b + (expert_row + row_hi) * row_bytes + 16 * t;
  const int scale_lane = kLaneK / block_values * t;  // this lane's first scale of a step
  const uint8_t* s_lo = p.b_scales + (expert_row + row_lo) * a.scales_per_row + scale_lane;
  const uint8_t* s_hi = p.b_scales + (expert_row + row_hi) * a.scales_per_row + scale_lane;
  const int k_begin = split * a.k_chunk;
  const int k_end = min(p.k, k_begin + a.k_chunk);
  const int scales_per_step = kStepK / block_values;  // scale bytes of a row per step

  const uint16_t* x_row[kFrags] = {};
  float acc[kFrags][4] = {};
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // Every warp runs the first round (masked when its K range is empty): it
  // takes part in staging the token row.
  for (int k0 = k_begin; k0 == k_begin || k0 < k_end; k0 += kSteps * kStepK) {
    uint4 wl[kSteps], wh[kSteps];
    uint32_t sl[kSteps], sh[kSteps];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int ks = k0 + u * kStepK;  // the step's K; this lane's values start at ks + 32t
      const bool in = ks + kLaneK * t < k_end;
      const size_t byte = static_cast<size_t>(ks) / 2;
      const int scale = ks / kStepK * scales_per_step;
      wl[u] = in && lo_ok ? load_weights(w_lo + byte) : zero;
      wh[u] = in && hi_ok ? load_weights(w_hi + byte) : zero;
      sl[u] = in && lo_ok ? load_scales(a, s_lo + scale) : 0u;
      sh[u] = in && hi_ok ? load_scales(a, s_hi + scale) : 0u;
    }
    if (k0 == k_begin) {
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
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int kk = k0 + u * kStepK + kLaneK * t;
      if (k0 + u * kStepK >= k_end) break;  // warp-uniform
      uint4 xv[kFrags][4];
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
      uint32_t dlo[16], dhi[16];
      dequantize(a, wl[u], sl[u], dlo);
      dequantize(a, wh[u], sh[u], dhi);
      mma_load<kFrags>(acc, dlo, dhi, xv);
    }
  }
  if (p.early_dependents) pdl_launch_dependents();

  // K splits meet in shared memory; split 0 adds them in split order.
  if (a.splits > 1) {
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int c = 0; c < 4; ++c) partial[(warp * 8 + f * 4 + c) * 32 + lane] = acc[f][c];
    __syncthreads();
    if (split != 0) return;
    for (int s = 1; s < a.splits; ++s)
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[f][c] += partial[((warp + s) * 8 + f * 4 + c) * 32 + lane];
  }

  // Lane (g, t) holds weight rows lo (c0, c1) and hi (c2, c3) of token rows 8f + 2t + j.
  const float global =
      p.b_global != nullptr ? p.b_global[tile.expert] * 0x1p9f : 1.0f;  // NVFP4: undo the 2^-9
  const float* bias = p.bias != nullptr ? p.bias + expert_row : nullptr;
  const float b_lo = bias != nullptr && lo_ok ? bias[row_lo] : 0.0f;
  const float b_hi = bias != nullptr && hi_ok ? bias[row_hi] : 0.0f;
#pragma unroll
  for (int f = 0; f < kFrags; ++f)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = 8 * f + 2 * t + j;
      if (r >= tile.rows) continue;
      uint16_t* out = p.out + static_cast<size_t>(tile.row_start + r) * p.n_out;
      const float v_lo = fmaf(acc[f][j], global, b_lo);
      const float v_hi = fmaf(acc[f][2 + j], global, b_hi);
      if (a.gated) {
        if (lo_ok)
          out[row_lo] = __bfloat16_as_ushort(
              __float2bfloat16_rn(gated_activation(p.epilogue, v_lo, v_hi, p.alpha, p.limit)));
      } else {
        if (lo_ok) out[row_lo] = __bfloat16_as_ushort(__float2bfloat16_rn(pointwise_activation(p.epilogue, v_lo)));
        if (hi_ok) out[row_hi] = __bfloat16_as_ushort(__float2bfloat16_rn(pointwise_activation(p.epilogue, v_hi)));
      }
    }
}

__global__ void __launch_bounds__(kThreads, 2) w4_stream_gemm_kernel(const Args a) {
  extern __shared__ __align__(16) uint16_t x_sm[];  // one-row tiles: the token row
  __shared__ float partial[kWarps * 8 * 32];
  const W4StreamGemmParams& p = a.p;
  if (!p.prefetch_before_wait) pdl_begin();
  const int tile_index = blockIdx.x / a.n_blocks;
  if (tile_index >= *p.num_tiles) return;
  const DeviceTile tile = p.tiles[tile_index];
  const int block = blockIdx.x - tile_index * a.n_blocks;
  if (tile.rows == 1)
    run_tile<1, kStepsOneRow, true>(a, tile, block, x_sm, partial);
  else if (tile.rows <= 8)
    run_tile<1, kStepsRows, false>(a, tile, block, x_sm, partial);
  else
    run_tile<2, kStepsRows, false>(a, tile, block, x_sm, partial);
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
  require(p.gather == nullptr || p.top_k >= 1, "top_k", is(p.top_k) + "must be >= 1");
  require((p.format == W4Format::NVFP4) == (p.b_global != nullptr), "b_global",
          "must be set for NVFP4 and only for NVFP4");
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
  Args a;
  a.p = p;
  a.gated = is_gated(p.epilogue);
  a.splits = w4_stream_splits(p.k);
  const int per_split = (p.k + a.splits - 1) / a.splits;
  a.k_chunk = (per_split + kStepK - 1) / kStepK * kStepK;
  a.cols_per_cta = kWarps / a.splits * (a.gated ? 8 : 16);
  a.n_blocks = ceil_div(p.n_out, a.cols_per_cta);
  a.scales_per_row = p.k / w4_block_values(p.format);
  const long long blocks = static_cast<long long>(p.max_tiles) * a.n_blocks;
  require(blocks <= INT_MAX, "max_tiles",
          "x column blocks = " + std::to_string(blocks) + " exceeds the grid limit");
  const size_t smem = static_cast<size_t>(p.k) * sizeof(uint16_t);  // a one-row tile's token row
  if (smem > 48 * 1024)
    UNIMOE_CUDA_CHECK(cudaFuncSetAttribute(w4_stream_gemm_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  launch_pdl(w4_stream_gemm_kernel, static_cast<unsigned>(blocks), kThreads, smem, stream, a);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
