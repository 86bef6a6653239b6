// The W4A16 grouped GEMM's wgmma form (contract: stream_gemm_w4.cuh, tile_m
// w4_wgmma_tile_m).
//
// The BF16 wgmma kernel (sm90_wgmma_gemm.cu) with 4-bit B: a CTA of two warp
// groups computes one 128-row x 256-B-row (tile, column block) work item with
// wgmma m64n256k16 from 128-byte-swizzled shared memory, over the same
// cp.async pipeline (WgmmaPipeline) whose A rows (token rows, gathered for
// GEMM1) arrive as in every tiled kernel. The B slot of each stage is
// written by the threads themselves: each thread owns two half rows (32 K
// values: 16 bytes of prepared e2m1 codes and their block scales) of every
// 64-wide K block, loads them from global memory two blocks ahead into
// registers, and when the pipeline refills the slot dequantizes them
// (w4_dequant.cuh: exact bf16, the block scale applied) and stores 64 bytes
// a half row into the swizzled B rows; the pipeline's proxy fence and
// barrier then publish them to wgmma with the A rows. Gate and up rows
// interleave as in the other tiled kernels, so the activation runs on the
// accumulators in the epilogue (tile_operands.cuh), after NVFP4's matrix
// scale (times 2^9, w4_dequant.cuh) scales the sums.
#include "kernels/gemm/sm90_w4_wgmma_gemm.cuh"

#include <cuda_bf16.h>

#include <climits>
#include <cstddef>
#include <stdexcept>
#include <string>
#include "kernels/gemm/grouped_gemm_args.cuh"
#include "kernels/gemm/sm90_wgmma_util.cuh"
#include "kernels/gemm/tile_operands.cuh"
#include "kernels/gemm/w4_dequant.cuh"

namespace unimoe {
namespace {

constexpr int kTileM = kWgmmaTileM;
constexpr int kTileN = 256;  // B rows a CTA: 128 gated output columns, or 256 plain ones
constexpr int kThreads = kWgmmaThreads;
constexpr int kStages = 4;
constexpr int kAccum = kTileN / 2;       // fp32 accumulators a thread: 64 x 256 / 128
constexpr int kHalfRows = 2 * kTileN / kThreads;  // half rows of B a thread dequantizes per K block
constexpr int kStageBytes = (kTileM + kTileN) * kSwizzleRowBytes;
constexpr int kStagedStride = kTileN + 8;  // bf16 epilogue staging, rows padded by 16 bytes
constexpr int kStagedBytes = kTileM * kStagedStride * 2;
constexpr int kSmemBytes = (kStages * kStageBytes > kStagedBytes ? kStages * kStageBytes : kStagedBytes) + kSmemAlign;
static_assert(kTileM == w4_wgmma_tile_m, "the contract's M tile");
static_assert(2 * kTileN % kThreads == 0, "every thread owns whole half rows");

__device__ __forceinline__ void store_shared_v4(uint32_t address, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}

// One K block of a thread's half rows, loaded and not yet dequantized.
struct HalfRows {
  uint4 codes[kHalfRows];
  uint32_t scales[kHalfRows];
};

// WgmmaPipeline's loader: the A rows by cp.async, the B rows dequantized
// from registers. load() must be called for K blocks 0, 1, 2, ... in order
// (the pipeline does): block k's codes were fetched by load(k - 2) (by the
// constructor for blocks 0 and 1), into the register set of k's parity.
struct W4Loader {
  TileRowsLoader<kThreads, kTileM> rows;
  W4Format format;
  int k;                  // K values
  int block_values;       // K values a scale covers
  const uint8_t* code[kHalfRows];   // the half row's codes in K block 0 (2 values a byte)
  const uint8_t* scale[kHalfRows];  // its scale byte(s) in K block 0
  uint32_t valid = 0;     // bit i: half row i is a B row of the call (column < n_out)
  int half;               // K values 32 * half .. 32 * half + 31 of each block
  mutable HalfRows even, odd;

  __device__ __forceinline__ W4Loader(const W4StreamGemmParams& p, const GroupedGemmArgs& view, int scale_stride,
                                      const DeviceTile& tile, bool gated, int n0, int tid)
      : rows(view, tile, tid), format(p.format), k(p.k), block_values(w4_block_values(p.format)) {
    half = tid & 1;
#pragma unroll
    for (int i = 0; i < kHalfRows; ++i) {
      const int j = (tid >> 1) + i * (kThreads / 2);  // the B row of the tile
      const int col = gated ? n0 + (j >> 1) : n0 + j;
      const int brow = gated && (j & 1) ? p.up_offset + col : col;
      if (col < p.n_out) valid |= 1u << i;
      const size_t row = static_cast<size_t>(tile.expert) * p.b_rows + (col < p.n_out ? brow : 0);
      code[i] = p.b + row * (p.k / 2) + 16 * half;
      scale[i] = p.b_scales + row * scale_stride + 32 * half / block_values;
    }
    fetch(0, even);
    fetch(1, odd);
  }

  // Codes and scales of K block k_tile, zero past K and for rows past n_out
  // (a zero scale code dequantizes zero codes to zero in both formats).
  __device__ __forceinline__ void fetch(int k_tile, HalfRows& h) const {
    const int k_elem = k_tile * kTileBlockK + 32 * half;
#pragma unroll
    for (int i = 0; i < kHalfRows; ++i) {
      const bool ok = (valid >> i & 1u) && k_elem < k;
      h.codes[i] = ok ? w4::load_codes(code[i] + k_tile * (kTileBlockK / 2)) : make_uint4(0, 0, 0, 0);
      h.scales[i] = ok ? w4::load_scales(format, scale[i] + k_tile * kTileBlockK / block_values) : 0u;
    }
  }

  // Four swizzled 16-byte chunks per half row (K values 8c .. 8c + 7 of the
  // half in chunk 4 * half + c).
  __device__ __forceinline__ void store(uint32_t stage, const HalfRows& h) const {
#pragma unroll
    for (int i = 0; i < kHalfRows; ++i) {
      uint32_t d[16];
      w4::dequantize(format, h.codes[i], h.scales[i], d);
      const int row = (threadIdx.x >> 1) + i * (kThreads / 2);
#pragma unroll
      for (int c = 0; c < 4; ++c)
        store_shared_v4(stage + kTileM * kSwizzleRowBytes + swizzled_offset(row, 4 * half + c), d[4 * c],
                        d[4 * c + 1], d[4 * c + 2], d[4 * c + 3]);
    }
  }

  __device__ __forceinline__ void load(const GroupedGemmArgs& view, uint32_t stage, int k_tile) const {
    rows.load(view, stage, k_tile);
    if (k_tile & 1) {
      store(stage, odd);
      fetch(k_tile + 2, odd);
    } else {
      store(stage, even);
      fetch(k_tile + 2, even);
    }
  }
};

__global__ void __launch_bounds__(kThreads, 1)
    w4_wgmma_gemm_kernel(const W4StreamGemmParams p, const GroupedGemmArgs view, int scale_stride) {
  pdl_begin();
  TileWork work;
  if (!tile_work(p.tiles, p.num_tiles, view.n_blocks, p.epilogue, kTileN, work)) return;

  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem;
  const uint32_t smem_base = align_to_swizzle_atom(smem_raw, &smem);

  const int tid = threadIdx.x;
  const W4Loader loader(p, view, scale_stride, work.tile, work.gated, work.n0, tid);
  const int k_tiles = (p.k + kTileBlockK - 1) / kTileBlockK;
  const WgmmaPipeline<kStages, kStageBytes, W4Loader, GroupedGemmArgs> pipe{loader, view, smem_base, k_tiles};
  pipe.prologue();

  float acc[kAccum];
  bf16_wgmma_mainloop<kTileN>(pipe, k_tiles, tid / 128, acc);
  const float g = p.b_global != nullptr ? p.b_global[work.tile.expert] * 0x1p9f : 1.0f;  // NVFP4: undo the 2^-9
  const float* bias = p.bias != nullptr ? p.bias + static_cast<size_t>(work.tile.expert) * p.b_rows : nullptr;
  bf16_wgmma_epilogue<kTileN>(view, work, bias, g, acc, reinterpret_cast<__nv_bfloat16*>(smem), kStagedStride);
}

}  // namespace

void launch_w4_wgmma_gemm(const W4StreamGemmParams& p, int scale_stride, KernelStream stream) {
  if (p.max_tiles == 0) return;
  // NVFP4's two scale bytes of a half row are read as one 16-bit word.
  if (p.format == W4Format::NVFP4 && scale_stride % 2 != 0)
    throw std::invalid_argument("launch_w4_stream_gemm: scale_stride is " + std::to_string(scale_stride) +
                                "; the wgmma form (tile_m 128) needs an even stride for NVFP4");
  GroupedGemmArgs view;  // the A loader's and the epilogue's view
  view.a = p.a;
  view.gather = p.gather;
  view.top_k = p.top_k;
  view.b_rows = p.b_rows;
  view.k = p.k;
  view.n_out = p.n_out;
  view.up_offset = p.up_offset;
  view.epilogue = p.epilogue;
  view.alpha = p.alpha;
  view.limit = p.limit;
  view.out = p.out;
  view.n_blocks = ceil_div(p.n_out, is_gated(p.epilogue) ? kTileN / 2 : kTileN);
  const long long blocks = static_cast<long long>(p.max_tiles) * view.n_blocks;
  if (blocks > INT_MAX)
    throw std::invalid_argument("launch_w4_stream_gemm: max_tiles x column blocks = " + std::to_string(blocks) +
                                " exceeds the grid limit");
  UNIMOE_CUDA_CHECK(
      cudaFuncSetAttribute(w4_wgmma_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  launch_pdl(w4_wgmma_gemm_kernel, static_cast<unsigned>(blocks), kThreads, kSmemBytes, stream, p, view,
             scale_stride);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
