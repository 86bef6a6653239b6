// The wgmma tactics of the mma path: a CTA of two warp groups computes one
// 128-row (tile, column block) work item of the device tile schedule, as the
// mma.sync kernel does (grouped_gemm.cu), but multiplies with Hopper's
// warp-group MMA: each warp group issues wgmma m64nNk16 (bf16 in, fp32
// accumulate in registers) on its 64 rows, both operands read by the tensor
// cores straight from 128-byte-swizzled shared memory.
//
// The operands arrive as in the mma.sync kernel: every thread issues 16-byte
// cp.async copies of A rows (gathered from x through the permutation for
// GEMM1, so there is no gather pass) and B rows (gate and up rows
// interleaved for the gated activations, so the activation runs in the
// epilogue on registers and the intermediate leaves the kernel once, as
// bf16). The pipeline keeps Stages slots: loads run Stages - 2 K blocks
// ahead, and one wgmma batch stays in flight while the next is issued, so a
// slot is refilled only after the barrier that follows both warp groups'
// wait for the batch that read it.
//
// cp.async writes shared memory through the generic proxy and wgmma reads it
// through the async proxy: each thread fences (fence.proxy.async) after its
// copies land and before the barrier that publishes the slot.
#include "kernels/gemm/sm90_wgmma_gemm.cuh"

#include <cuda_bf16.h>

#include <climits>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/gemm/sm90_wgmma_util.cuh"
#include "kernels/gemm/tile_operands.cuh"

namespace unimoe {
namespace {

constexpr int kTileM = 128;      // two warp groups of 64 rows
constexpr int kThreads = 256;

template <int TileN, int Stages, int MinBlocks>
struct WgConfig {
  static constexpr int kTileN = TileN;
  static constexpr int kStages = Stages;
  static constexpr int kMinBlocks = MinBlocks;
  static constexpr int kAccum = TileN / 2;  // fp32 accumulators a thread: 64 x TileN / 128
  static constexpr int kStageBytes = (kTileM + TileN) * kSwizzleRowBytes;
  static constexpr int kStagedStride = TileN + 8;  // bf16; rows padded by 16 bytes
  static constexpr int kStagedBytes = kTileM * kStagedStride * 2;
  static constexpr int kSmemBytes =
      (Stages * kStageBytes > kStagedBytes ? Stages * kStageBytes : kStagedBytes) + kSmemAlign;
  static_assert(TileN == 128 || TileN == 256, "wgmma m64n128k16 or m64n256k16");
};

template <int TileN>
struct Wgmma;
template <>
struct Wgmma<128> {
  using Op = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                             cute::SM90::GMMA::Major::K>;
};
template <>
struct Wgmma<256> {
  using Op = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                             cute::SM90::GMMA::Major::K>;
};

// d += A(64 x 16) * B(TileN x 16)^T, the accumulators as one array.
template <int TileN, std::size_t... I>
__device__ __forceinline__ void wgmma_k16(float (&d)[TileN / 2], uint64_t a, uint64_t b,
                                          std::index_sequence<I...>) {
  Wgmma<TileN>::Op::fma(a, b, d[I]..., cute::SM90::GMMA::ScaleOut::One);
}

template <class Cfg>
__global__ void __launch_bounds__(kThreads, Cfg::kMinBlocks) wgmma_gemm_kernel(const GroupedGemmArgs args) {
  pdl_begin();
  constexpr int kTileN = Cfg::kTileN, kStages = Cfg::kStages;
  TileWork work;
  if (!tile_work(args.tiles, args.num_tiles, args.n_blocks, args.epilogue, kTileN, work)) return;
  const DeviceTile& tile = work.tile;
  const bool gated = work.gated;
  const int out_cols = work.out_cols, n0 = work.n0;

  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem;
  const uint32_t smem_base = align_to_swizzle_atom(smem_raw, &smem);

  const int tid = threadIdx.x;
  const TileOperandLoader<kThreads, kTileM, kTileN> loader(args, tile, gated, n0, tid);
  const int k_tiles = (args.k + kTileBlockK - 1) / kTileBlockK;
  const WgmmaPipeline<kStages, Cfg::kStageBytes, decltype(loader), GroupedGemmArgs> pipe{loader, args, smem_base,
                                                                                         k_tiles};
  pipe.prologue();

  float acc[Cfg::kAccum];
#pragma unroll
  for (int i = 0; i < Cfg::kAccum; ++i) acc[i] = 0.0f;
  const int group = tid / 128;  // this warp group's rows: 64 * group ...
  constexpr auto kAccumIndex = std::make_index_sequence<Cfg::kAccum>{};

  for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
    const uint32_t stage = pipe.acquire(k_tile);
    const uint32_t a = stage + group * 64 * kSwizzleRowBytes;
    const uint32_t b = stage + kTileM * kSwizzleRowBytes;
    fence_accumulators(acc);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < kTileBlockK / 16; ++kk)  // 16 K values: 32 bytes along the swizzled row
      wgmma_k16<kTileN>(acc, sw128_descriptor(a + kk * 32), sw128_descriptor(b + kk * 32), kAccumIndex);
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<1>();
    fence_accumulators(acc);
  }
  cute::warpgroup_wait<0>();
  fence_accumulators(acc);

  // ---- epilogue: as the mma.sync kernel's, from the wgmma accumulator
  // layout: warp w of the group holds rows 16w + g and 16w + g + 8 (g =
  // lane / 4) and, in each n8 block j, columns 8j + 2(lane % 4) + {0, 1}.
  cp_async_wait<0>();
  __syncthreads();  // both groups' MMAs are done with every slot
  __nv_bfloat16* staged = reinterpret_cast<__nv_bfloat16*>(smem);  // [kTileM, kStagedStride]
  const float* bias =
      args.bias != nullptr ? args.bias + static_cast<size_t>(tile.expert) * args.b_rows : nullptr;
  const int lane = tid % 32, warp = (tid % 128) / 32;
  const int row0 = group * 64 + warp * 16 + (lane >> 2);
  const int col0 = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < kTileN / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      stage_output_pair(args, bias, gated, n0, staged, Cfg::kStagedStride, row0 + 8 * half, 8 * j + col0,
                        acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
  __syncthreads();
  store_staged_tile<kTileM, kThreads>(args, tile, staged, Cfg::kStagedStride, n0, out_cols, tid);
}

// wg_m128n256: one CTA an SM (four 48 KB slots), the widest B tile: each
// A row read serves 256 B rows, for compute-bound sizes.
// wg_m128n128: two CTAs an SM (three 32 KB slots each), so one CTA's
// epilogue and prologue overlap the other's multiply: for short K (GEMM2
// of small intermediates) and few column blocks.
using WgM128N256 = WgConfig<256, 4, 1>;
using WgM128N128 = WgConfig<128, 3, 2>;

template <class Cfg>
void launch_config(const GroupedGemmArgs& args, int max_tiles, KernelStream stream) {
  const long long blocks = static_cast<long long>(max_tiles) * args.n_blocks;
  if (blocks > INT_MAX)
    throw std::runtime_error("launch_wgmma_gemm: max_tiles x column blocks = " + std::to_string(blocks) +
                             " exceeds the grid limit");
  UNIMOE_CUDA_CHECK(cudaFuncSetAttribute(wgmma_gemm_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Cfg::kSmemBytes));
  launch_pdl(wgmma_gemm_kernel<Cfg>, static_cast<unsigned>(blocks), kThreads, Cfg::kSmemBytes, stream, args);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace

void launch_wgmma_gemm(const GroupedGemmArgs& args, const GemmTactic& tactic, int max_tiles,
                       KernelStream stream) {
  if (!tactic.wgmma || tactic.tile_m != kTileM)
    throw std::runtime_error("launch_wgmma_gemm: " + tactic.to_string() + " is not a wgmma tactic");
  if (tactic.tile_n == 256) return launch_config<WgM128N256>(args, max_tiles, stream);
  if (tactic.tile_n == 128) return launch_config<WgM128N128>(args, max_tiles, stream);
  throw std::runtime_error("launch_wgmma_gemm: no wgmma build for " + tactic.to_string());
}

}  // namespace unimoe
