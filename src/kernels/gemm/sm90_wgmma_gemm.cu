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
#include "kernels/gemm/sm90_wgmma_util.cuh"
#include "kernels/gemm/tile_operands.cuh"

namespace unimoe {
namespace {

constexpr int kTileM = kWgmmaTileM;
constexpr int kThreads = kWgmmaThreads;

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

template <class Cfg>
__global__ void __launch_bounds__(kThreads, Cfg::kMinBlocks) wgmma_gemm_kernel(const GroupedGemmArgs args) {
  pdl_begin();
  constexpr int kTileN = Cfg::kTileN, kStages = Cfg::kStages;
  TileWork work;
  if (!tile_work(args.tiles, args.num_tiles, args.n_blocks, args.epilogue, kTileN, work)) return;

  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem;
  const uint32_t smem_base = align_to_swizzle_atom(smem_raw, &smem);

  const int tid = threadIdx.x;
  const TileOperandLoader<kThreads, kTileM, kTileN> loader(args, work.tile, work.gated, work.n0, tid);
  const int k_tiles = (args.k + kTileBlockK - 1) / kTileBlockK;
  const WgmmaPipeline<kStages, Cfg::kStageBytes, decltype(loader), GroupedGemmArgs> pipe{loader, args, smem_base,
                                                                                         k_tiles};
  pipe.prologue();

  float acc[Cfg::kAccum];
  bf16_wgmma_mainloop<kTileN>(pipe, k_tiles, tid / 128, acc);
  const float* bias =
      args.bias != nullptr ? args.bias + static_cast<size_t>(work.tile.expert) * args.b_rows : nullptr;
  bf16_wgmma_epilogue<kTileN>(args, work, bias, 1.0f, acc, reinterpret_cast<__nv_bfloat16*>(smem),
                              Cfg::kStagedStride);
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
