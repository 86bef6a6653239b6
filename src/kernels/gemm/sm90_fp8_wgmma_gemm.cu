// The FP8 grouped GEMM of the mma path (contract: sm90_fp8_wgmma_gemm.cuh).
//
// The BF16 wgmma kernel's design (sm90_wgmma_gemm.cu) with e4m3 operands: a
// CTA of two warp groups computes one 128 x 128 (tile, column block) work
// item; each warp group multiplies its 64 rows with wgmma m64n128k32 from
// 128-byte-swizzled shared memory. A swizzled row of e4m3 is 128 K values:
// one scale block. The loads are the tiled kernels' cp.async copies
// (tile_operands.cuh), here of bytes (the loader counts 16-bit units, so it
// sees K / 2 of them): A rows gathered from the token rows through the
// permutation (GEMM1) or read in order (GEMM2), B rows of the tile's expert
// with gate and up rows interleaved for the gated activations.
//
// Promotion: the four wgmmas of K block kb write a fresh accumulator (the
// first with its input scale zero); once they are done, each thread adds
// acc * (a_scale(row, kb) * b_scale(block row, kb)) to its fp32 sum. A
// thread's entries lie in two rows (g and g + 8 of its warp's 16) and, per
// column pair, in the gate or up block of a gated tile (even columns gate,
// odd up) or the one block of a plain tile, so four scales a K block serve
// all of them; they are read during the block's MMAs.
//
// Epilogue: bias, activation, then fp32 (GEMM1's activated values, which a
// quantize kernel turns into GEMM2's e4m3 rows) or bf16 (GEMM2's y) staged
// in shared memory and stored with 16-byte writes.
#include "kernels/gemm/sm90_fp8_wgmma_gemm.cuh"

#include <cuda_bf16.h>

#include <climits>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/gemm/grouped_gemm_args.cuh"
#include "kernels/gemm/sm90_wgmma_util.cuh"
#include "kernels/gemm/tile_operands.cuh"

namespace unimoe {
namespace {

constexpr int kTileM = kWgmmaTileM;
constexpr int kTileN = 128;             // B rows a CTA: 64 gated output columns, or 128 plain ones
constexpr int kThreads = kWgmmaThreads;
static_assert(kTileM == kFp8WgmmaTileM, "the contract's M tile");
constexpr int kBlock = 128;             // K values a scale block (and a swizzled row) holds
constexpr int kStages = 5;
constexpr int kAccum = kTileN / 2;      // fp32 accumulators a thread: 64 x 128 / 128
constexpr int kStageBytes = (kTileM + kTileN) * kSwizzleRowBytes;
constexpr int kStagedStride = kTileN + 4;  // fp32 staging, rows padded by 16 bytes
constexpr int kStagedBytes = kTileM * kStagedStride * 4;
constexpr int kSmemBytes = (kStages * kStageBytes > kStagedBytes ? kStages * kStageBytes : kStagedBytes) + kSmemAlign;
static_assert(kBlock == kSwizzleRowBytes, "one swizzled row of e4m3 is one scale block");

using Wgmma = cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>;

template <std::size_t... I>
__device__ __forceinline__ void wgmma_k32(float (&d)[kAccum], uint64_t a, uint64_t b,
                                          cute::SM90::GMMA::ScaleOut scale, std::index_sequence<I...>) {
  Wgmma::fma(a, b, d[I]..., scale);
}

__global__ void __launch_bounds__(kThreads, 1)
    fp8_wgmma_gemm_kernel(const Fp8StreamGemmParams p, const GroupedGemmArgs view) {
  pdl_begin();
  TileWork work;
  if (!tile_work(p.tiles, p.num_tiles, view.n_blocks, p.epilogue, kTileN, work)) return;
  const DeviceTile& tile = work.tile;
  const bool gated = work.gated;
  const int n0 = work.n0;

  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem;
  const uint32_t smem_base = align_to_swizzle_atom(smem_raw, &smem);

  const int tid = threadIdx.x;
  const TileOperandLoader<kThreads, kTileM, kTileN> loader(view, tile, gated, n0, tid);
  const int k_tiles = p.k / kBlock;
  const WgmmaPipeline<kStages, kStageBytes, decltype(loader), GroupedGemmArgs> pipe{loader, view, smem_base, k_tiles};
  pipe.prologue();

  // This thread's rows (tile rows r0 and r0 + 8) and their A rows; rows past
  // the tile are zero-filled, so any finite scale serves them.
  const int group = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int r0 = group * 64 + warp * 16 + (lane >> 2);
  auto a_row = [&](int r) {
    if (r >= tile.rows) return 0;
    const int permuted = tile.row_start + r;
    return p.gather != nullptr ? p.gather[permuted] / p.top_k : permuted;
  };
  const float* a_scale0 = p.a_scales + a_row(r0);
  const float* a_scale1 = p.a_scales + a_row(r0 + 8);
  // The B scale rows of the tile's gate (or only) block and up block.
  const int scale_rows = (p.b_rows + kBlock - 1) / kBlock;
  const int gate_block = n0 / kBlock;
  const int up_block = gated ? (p.up_offset + n0) / kBlock : gate_block;
  const float* b_scale_gate = p.b_scales + (static_cast<size_t>(tile.expert) * scale_rows + gate_block) * k_tiles;
  const float* b_scale_up = p.b_scales + (static_cast<size_t>(tile.expert) * scale_rows + up_block) * k_tiles;

  float sum[kAccum], acc[kAccum];
#pragma unroll
  for (int i = 0; i < kAccum; ++i) sum[i] = acc[i] = 0.0f;
  constexpr auto kAccumIndex = std::make_index_sequence<kAccum>{};

  for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
    const uint32_t stage = pipe.acquire(k_tile);
    const uint32_t a = stage + group * 64 * kSwizzleRowBytes;
    const uint32_t b = stage + kTileM * kSwizzleRowBytes;
    fence_accumulators(acc);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < kBlock / 32; ++kk)  // 32 K values: 32 bytes along the swizzled row
      wgmma_k32(acc, sw128_descriptor(a + kk * 32), sw128_descriptor(b + kk * 32),
                kk == 0 ? cute::SM90::GMMA::ScaleOut::Zero : cute::SM90::GMMA::ScaleOut::One, kAccumIndex);
    cute::warpgroup_commit_batch();
    const float sa0 = a_scale0[static_cast<size_t>(k_tile) * p.a_scales_ld];
    const float sa1 = a_scale1[static_cast<size_t>(k_tile) * p.a_scales_ld];
    const float sb_gate = b_scale_gate[k_tile], sb_up = b_scale_up[k_tile];
    const float s00 = sa0 * sb_gate, s01 = sa0 * sb_up, s10 = sa1 * sb_gate, s11 = sa1 * sb_up;
    cute::warpgroup_wait<0>();
    fence_accumulators(acc);
    // Entry i: row r0 + 8 * ((i >> 1) & 1), column 8 * (i >> 2) + 2 * (lane % 4) + (i & 1).
#pragma unroll
    for (int i = 0; i < kAccum; i += 4) {
      sum[i] = fmaf(acc[i], s00, sum[i]);
      sum[i + 1] = fmaf(acc[i + 1], s01, sum[i + 1]);
      sum[i + 2] = fmaf(acc[i + 2], s10, sum[i + 2]);
      sum[i + 3] = fmaf(acc[i + 3], s11, sum[i + 3]);
    }
  }

  // ---- epilogue
  const float* bias = p.bias != nullptr ? p.bias + static_cast<size_t>(tile.expert) * p.b_rows : nullptr;
  const int col0 = 2 * (lane & 3);
  if (p.out_bf16 != nullptr) {
    bf16_wgmma_epilogue<kTileN>(view, work, bias, 1.0f, sum, reinterpret_cast<__nv_bfloat16*>(smem), kTileN + 8);
    return;
  }
  cp_async_wait<0>();
  __syncthreads();  // every thread's MMAs are done with every slot
  float* staged = reinterpret_cast<float*>(smem);  // [kTileM, kStagedStride]
#pragma unroll
  for (int j = 0; j < kTileN / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = r0 + 8 * half, col = 8 * j + col0;
      float v0 = sum[4 * j + 2 * half], v1 = sum[4 * j + 2 * half + 1];
      if (gated) {
        const int c = col >> 1;
        if (bias != nullptr && n0 + c < p.n_out) {
          v0 += bias[n0 + c];
          v1 += bias[p.up_offset + n0 + c];
        }
        staged[row * kStagedStride + c] = gated_activation(p.epilogue, v0, v1, p.alpha, p.limit);
      } else {
        if (bias != nullptr && n0 + col < p.n_out) {
          v0 += bias[n0 + col];
          v1 += bias[n0 + col + 1];
        }
        staged[row * kStagedStride + col] = pointwise_activation(p.epilogue, v0);
        staged[row * kStagedStride + col + 1] = pointwise_activation(p.epilogue, v1);
      }
    }
  __syncthreads();
  // n_out is a multiple of 16 and out_cols of 64: a 4-float chunk is valid or not as a whole.
  const int chunks_per_row = work.out_cols / 4;
  for (int c = tid; c < kTileM * chunks_per_row; c += kThreads) {
    const int row = c / chunks_per_row;
    const int col = (c - row * chunks_per_row) * 4;
    if (row >= tile.rows || n0 + col >= p.n_out) continue;
    *reinterpret_cast<float4*>(p.out_f32 + static_cast<size_t>(tile.row_start + row) * p.n_out + n0 + col) =
        *reinterpret_cast<const float4*>(staged + row * kStagedStride + col);
  }
}

void require(bool ok, const std::string& field, const std::string& message) {
  if (!ok) throw std::invalid_argument("launch_fp8_wgmma_gemm: " + field + " " + message);
}

}  // namespace

void launch_fp8_wgmma_gemm(const Fp8StreamGemmParams& p, KernelStream stream) {
  require(p.max_tiles >= 0, "max_tiles", "is " + std::to_string(p.max_tiles) + "; must be >= 0");
  if (p.max_tiles == 0) return;
  const bool gated = is_gated(p.epilogue);
  require(p.k > 0 && p.k % kBlock == 0, "k", "is " + std::to_string(p.k) + "; must be a positive multiple of 128");
  require(p.n_out > 0 && p.n_out % 16 == 0, "n_out",
          "is " + std::to_string(p.n_out) + "; must be a positive multiple of 16");
  // Gated, a CTA takes 64 output columns: 64 gate and 64 up rows, each a
  // run of 64 aligned to 64, so within one 128-row scale block.
  require(!gated || (p.n_out % 64 == 0 && p.up_offset % 64 == 0), "n_out",
          "and up_offset are " + std::to_string(p.n_out) + " and " + std::to_string(p.up_offset) +
              "; a gated epilogue needs multiples of 64");
  require(p.b_rows >= (gated ? p.up_offset + p.n_out : p.n_out), "b_rows",
          "is " + std::to_string(p.b_rows) + "; too few for n_out (and up_offset)");
  require(p.top_k > 0, "top_k", "is " + std::to_string(p.top_k) + "; must be > 0");
  require(p.a_scales_ld > 0, "a_scales_ld", "is " + std::to_string(p.a_scales_ld) + "; must be > 0");
  require((p.out_f32 != nullptr) != (p.out_bf16 != nullptr), "out_f32/out_bf16", "exactly one must be set");
  require(p.a != nullptr && p.a_scales != nullptr && p.b != nullptr && p.b_scales != nullptr && p.tiles != nullptr &&
              p.num_tiles != nullptr,
          "a, a_scales, b, b_scales, tiles, num_tiles", "must not be null");

  GroupedGemmArgs view;  // the loader's and the bf16 epilogue's view: 16-bit units of e4m3 pairs
  view.a = reinterpret_cast<const uint16_t*>(p.a);
  view.gather = p.gather;
  view.top_k = p.top_k;
  view.b = reinterpret_cast<const uint16_t*>(p.b);
  view.b_rows = p.b_rows;
  view.k = p.k / 2;
  view.n_out = p.n_out;
  view.up_offset = p.up_offset;
  view.epilogue = p.epilogue;
  view.alpha = p.alpha;
  view.limit = p.limit;
  view.out = p.out_bf16;
  view.n_blocks = ceil_div(p.n_out, gated ? kTileN / 2 : kTileN);
  const long long blocks = static_cast<long long>(p.max_tiles) * view.n_blocks;
  require(blocks <= INT_MAX, "max_tiles", "x column blocks = " + std::to_string(blocks) + " exceeds the grid limit");
  UNIMOE_CUDA_CHECK(
      cudaFuncSetAttribute(fp8_wgmma_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  launch_pdl(fp8_wgmma_gemm_kernel, static_cast<unsigned>(blocks), kThreads, kSmemBytes, stream, p, view);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
