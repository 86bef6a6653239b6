// The BF16 grouped GEMMs of the experts stages (contract: grouped_gemm.cuh).
// One kernel serves GEMM1 and GEMM2: a CTA takes one (tile, column block)
// work item of the device tile schedule, streams its A rows (gathered from x
// for GEMM1) and its expert's B rows through a cp.async pipeline in swizzled
// shared memory, multiplies with mma.sync m16n8k16 (bf16 in, fp32
// accumulate), applies bias and activation and stores bf16 through shared
// memory with 16-byte writes.
//
// The grid is fixed by the host's capacity (max_tiles x column blocks); a CTA
// whose tile index is at or past the device count *num_tiles exits at once,
// so the launch is the same for every routing outcome (graph-safe). Measured
// on an H200, those idle CTAs cost nothing visible (T = 1 with 8 or 256 local
// experts runs in the same time), and hardware scheduling of one item per CTA
// beat a persistent grid with a static item stride by 10% at large T.
#include "kernels/gemm/grouped_gemm.cuh"

#include <cuda_bf16.h>

#include <climits>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "kernels/common/common.cuh"
#include "kernels/gemm/grouped_gemm_args.cuh"
#include "kernels/epilogue/grouped_gemm_epilogue.cuh"
#include "kernels/gemm/stream_gemm.cuh"
#include "kernels/gemm/tile_operands.cuh"
#include "kernels/gemm/warp_mma.cuh"
#include "kernels/gemm/sm90_wgmma_gemm.cuh"

namespace unimoe {
namespace {

constexpr int kBlockK = kTileBlockK;  // K per pipeline stage: one swizzled shared-memory row

// A tactic: CTA tile, warp grid, pipeline depth, and the CTAs per SM that the
// register budget is built for.
template <int TileM, int TileN, int WarpsM, int WarpsN, int Stages, int MinBlocks>
struct TileConfig {
  static constexpr int kTileM = TileM;
  static constexpr int kTileN = TileN;
  static constexpr int kWarpsN = WarpsN;
  static constexpr int kStages = Stages;
  static constexpr int kMinBlocks = MinBlocks;
  static constexpr int kThreads = 32 * WarpsM * WarpsN;
  static constexpr int kWarpM = TileM / WarpsM;
  static constexpr int kWarpN = TileN / WarpsN;
  static constexpr int kFragsM = kWarpM / 16;  // m16 fragments per warp
  static constexpr int kFragsN = kWarpN / 8;   // n8 fragments per warp
  static constexpr int kStageBytes = (TileM + TileN) * kSwizzleRowBytes;
  // The epilogue stages the output tile in bf16, rows padded by 16 bytes.
  static constexpr int kStagedStride = TileN + 8;
  static constexpr int kStagedBytes = TileM * kStagedStride * 2;
  static constexpr int kSmemBytes =
      Stages * kStageBytes > kStagedBytes ? Stages * kStageBytes : kStagedBytes;

  static_assert(TileM % (16 * WarpsM) == 0 && TileN % (16 * WarpsN) == 0,
                "warp tiles are whole m16 fragments and pairs of n8 fragments");
  static_assert(Stages >= 2, "a pipeline needs two stages");
  static_assert(kStagedStride * 2 % 16 == 0, "staged rows must keep 16-byte alignment");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    grouped_gemm_kernel(const GroupedGemmArgs args) {
  pdl_begin();
  constexpr int kTileM = Cfg::kTileM, kTileN = Cfg::kTileN, kStages = Cfg::kStages;

  const int tile_index = blockIdx.x / args.n_blocks;
  if (tile_index >= *args.num_tiles) return;
  const DeviceTile tile = args.tiles[tile_index];
  const int block_n = blockIdx.x - tile_index * args.n_blocks;
  const bool gated = is_gated(args.epilogue);
  const int out_cols = gated ? kTileN / 2 : kTileN;  // output columns of this CTA
  const int n0 = block_n * out_cols;                 // its first output column

  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_base = shared_address(smem);

  const int tid = threadIdx.x;
  const TileOperandLoader<Cfg::kThreads, kTileM, kTileN> loader(args, tile, gated, n0, tid);
  auto load_stage = [&](int k_tile, int stage) {
    loader.load(args, smem_base + stage * Cfg::kStageBytes, k_tile);
  };

  // ---- main loop: kStages - 1 tiles in flight while one is multiplied.
  const int k_tiles = (args.k + kBlockK - 1) / kBlockK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }

  const int lane = tid % 32, warp = tid / 32;
  const int warp_m = warp / Cfg::kWarpsN, warp_n = warp % Cfg::kWarpsN;
  // ldmatrix row addresses: A lanes 0-15 rows 0-15 (k 0-7), lanes 16-31 the
  // same rows (k 8-15); B lanes in groups of 8: (n 0-7, k 0-7), (n 0-7, k 8-15),
  // (n 8-15, k 0-7), (n 8-15, k 8-15), which are b0, b1 of two n8 fragments.
  const int a_row = warp_m * Cfg::kWarpM + (lane & 15);
  const int a_half = lane >> 4;
  const int b_row = warp_n * Cfg::kWarpN + (lane & 7) + ((lane >> 4) << 3);
  const int b_half = (lane >> 3) & 1;

  float acc[Cfg::kFragsM][Cfg::kFragsN][4];
#pragma unroll
  for (int mi = 0; mi < Cfg::kFragsM; ++mi)
#pragma unroll
    for (int ni = 0; ni < Cfg::kFragsN; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][ni][c] = 0.0f;

  for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
    cp_async_wait<kStages - 2>();
    // Also guarantees every warp is done with the slot the next copy overwrites.
    __syncthreads();
    const int next = k_tile + kStages - 1;
    if (next < k_tiles) load_stage(next, next % kStages);
    cp_async_commit();

    const uint32_t a_stage = smem_base + (k_tile % kStages) * Cfg::kStageBytes;
    const uint32_t b_stage = a_stage + kTileM * kSwizzleRowBytes;
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      uint32_t a_frag[Cfg::kFragsM][4];
#pragma unroll
      for (int mi = 0; mi < Cfg::kFragsM; ++mi)
        ldmatrix_x4(a_frag[mi], a_stage + swizzled_offset(a_row + mi * 16, kk * 2 + a_half));
      uint32_t b_frag[Cfg::kFragsN][2];
#pragma unroll
      for (int nj = 0; nj < Cfg::kFragsN / 2; ++nj) {
        uint32_t r[4];
        ldmatrix_x4(r, b_stage + swizzled_offset(b_row + nj * 16, kk * 2 + b_half));
        b_frag[2 * nj][0] = r[0];
        b_frag[2 * nj][1] = r[1];
        b_frag[2 * nj + 1][0] = r[2];
        b_frag[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < Cfg::kFragsM; ++mi)
#pragma unroll
        for (int ni = 0; ni < Cfg::kFragsN; ++ni)
          mma_bf16_16816(acc[mi][ni], a_frag[mi], b_frag[ni][0], b_frag[ni][1]);
    }
  }

  // ---- epilogue: bias + activation in fp32, bf16 into shared memory (which
  // the pipeline no longer uses once every copy has landed), then rows < rows
  // and columns < n_out go out as 16-byte stores.
  cp_async_wait<0>();
  __syncthreads();
  __nv_bfloat16* staged = reinterpret_cast<__nv_bfloat16*>(smem);  // [kTileM, kStagedStride]
  const float* bias =
      args.bias != nullptr ? args.bias + static_cast<size_t>(tile.expert) * args.b_rows : nullptr;
  // Accumulator layout: thread (g, t) holds rows g and g + 8, columns 2t and 2t + 1.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < Cfg::kFragsM; ++mi)
#pragma unroll
    for (int ni = 0; ni < Cfg::kFragsN; ++ni)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp_m * Cfg::kWarpM + mi * 16 + half * 8 + g;
        const int col = warp_n * Cfg::kWarpN + ni * 8 + 2 * t;  // tile column of the pair
        stage_output_pair(args, bias, gated, n0, staged, Cfg::kStagedStride, row, col, acc[mi][ni][2 * half],
                          acc[mi][ni][2 * half + 1]);
      }
  __syncthreads();

  store_staged_tile<kTileM, Cfg::kThreads>(args, tile, staged, Cfg::kStagedStride, n0, out_cols, tid);
}

// ---- the compiled tactics, best first for large T (picked by timing
// variants on an H200).
// m128n128: 8 warps of 64x32, two CTAs per SM, for compute-bound sizes.
// m64n128: 4 warps of 32x64, three CTAs per SM, for mid-size experts.
// m48n128: 4 warps of 48x32, three CTAs an SM, for about 32 rows per
// expert, which a 64-row tile pads to twice the MMA work and 32-row tiles
// split in two for every expert above its mean.
// m32n64: for 9-16 rows per expert, where 16-row tiles stream an expert's
// weights twice and 64-row tiles leave few CTAs (the rule's tile there,
// plan/layer_plan.cpp; at 32 rows per expert m64n128 won).
// m32n64x5: the same tile with a 3-stage pipeline, five CTAs an SM, for
// GEMM2 (plan/layer_plan.cpp says where it won): a whole grid of few column
// blocks (mixtral-8x7b T=64: 512 CTAs) fits in one wave instead of 1.3, and
// short-K CTAs (dsv3-tp8, K = 256) overlap more prologues and epilogues.
// m16n128, m16n64: for decode, where an expert has a few rows and the cost is
// streaming its weights: deep pipelines of 16-byte copies and, with the
// narrower tile, more CTAs to spread the weights over every SM.
// m16n32: a tuning candidate for decode where an m16n64 grid has too few
// CTAs to cover the SMs evenly (qwen3-30b-a3b T=1: 192 CTAs on 132 SMs):
// twice the CTAs, two warps each, six an SM.
// stream_m16 (stream_gemm.cu): swap-AB, weights straight into registers.
using TileM128N128 = TileConfig<128, 128, 2, 4, 3, 2>;
using TileM64N128 = TileConfig<64, 128, 2, 2, 3, 3>;
using TileM48N128 = TileConfig<48, 128, 1, 4, 3, 3>;
using TileM32N64 = TileConfig<32, 64, 1, 4, 6, 3>;
using TileM32N64X5 = TileConfig<32, 64, 1, 4, 3, 5>;
using TileM16N128 = TileConfig<16, 128, 1, 4, 6, 2>;
using TileM16N64 = TileConfig<16, 64, 1, 4, 6, 3>;
using TileM16N32 = TileConfig<16, 32, 1, 2, 6, 6>;

using GemmKernel = void (*)(GroupedGemmArgs);

struct CompiledTactic {
  GemmKernel kernel;
  int threads;
  int smem_bytes;
};

template <class Cfg>
CompiledTactic compiled() {
  return CompiledTactic{grouped_gemm_kernel<Cfg>, Cfg::kThreads, Cfg::kSmemBytes};
}

// The plan's list of tactics (plan/tactics.h), in compiled_tactic order.
constexpr const GemmTactic* kTactics = kMmaTactics;
constexpr int kNumTactics = kNumMmaTactics;

// A tactic's ctas_per_sm of 0 names the tile's standard build; else it must
// be the build's CTAs an SM.
template <class Cfg>
constexpr bool same_tile(int index) {
  const GemmTactic& t = kMmaTactics[index];
  return !t.stream && !t.wgmma && t.tile_m == Cfg::kTileM && t.tile_n == Cfg::kTileN &&
         (t.ctas_per_sm == 0 || t.ctas_per_sm == Cfg::kMinBlocks);
}
// The tiled configs first, then the wgmma ones (sm90_wgmma_gemm.cu), then the
// stream kernel (stream_gemm.cu).
constexpr int kFirstWgmmaIndex = 8;
constexpr int kStreamIndex = 10;
static_assert(kNumMmaTactics == 11 && same_tile<TileM128N128>(0) && same_tile<TileM64N128>(1) &&
                  same_tile<TileM48N128>(2) && same_tile<TileM32N64>(3) &&
                  same_tile<TileM32N64X5>(4) && kMmaTactics[4].ctas_per_sm != 0 &&
                  same_tile<TileM16N128>(5) && same_tile<TileM16N64>(6) &&
                  same_tile<TileM16N32>(7) && kMmaTactics[kFirstWgmmaIndex].wgmma &&
                  kMmaTactics[kFirstWgmmaIndex + 1].wgmma &&
                  kMmaTactics[kStreamIndex].stream &&
                  kMmaTactics[kStreamIndex].tile_m == kStreamTileM,
              "plan/tactics.h's kMmaTactics must list the compiled configs in order");

// The kernel of a tactic, in kTactics order.
CompiledTactic compiled_tactic(int index) {
  switch (index) {
    case 0: return compiled<TileM128N128>();
    case 1: return compiled<TileM64N128>();
    case 2: return compiled<TileM48N128>();
    case 3: return compiled<TileM32N64>();
    case 4: return compiled<TileM32N64X5>();
    case 5: return compiled<TileM16N128>();
    case 6: return compiled<TileM16N64>();
    default: return compiled<TileM16N32>();
  }
}

std::string compiled_names() {
  std::string names;
  for (int i = 0; i < kNumTactics; ++i) names += (names.empty() ? "" : ", ") + kTactics[i].to_string();
  return names;
}

void require(bool ok, const char* who, const std::string& message) {
  if (!ok) throw std::runtime_error(std::string(who) + ": " + message);
}

// Checks what the kernel relies on, sizes the grid from the capacity and launches.
void launch_grouped_gemm(GroupedGemmArgs args, const GemmTactic& tactic, int max_tiles,
                         const StreamGemmOptions& options, KernelStream stream, const char* who) {
  int index = 0;
  while (index < kNumTactics && kTactics[index] != tactic) ++index;
  require(index < kNumTactics, who,
          "tactic " + tactic.to_string() + " is not compiled; compiled: " + compiled_names());
  require(args.k > 0 && args.k % 8 == 0, who,
          "K is " + std::to_string(args.k) + "; must be a positive multiple of 8");
  require(args.n_out > 0 && args.n_out % 8 == 0, who,
          "N is " + std::to_string(args.n_out) + "; must be a positive multiple of 8");
  require(max_tiles >= 0, who, "max_tiles is " + std::to_string(max_tiles) + "; must be >= 0");
  if (max_tiles == 0) return;
  require(args.a != nullptr && args.b != nullptr && args.out != nullptr && args.tiles != nullptr &&
              args.num_tiles != nullptr,
          who, "an input, the weights, the output or the tile schedule is null");

  if (index == kStreamIndex) {
    launch_stream_gemm(args, max_tiles, options, stream);
    return;
  }
  const int out_cols = is_gated(args.epilogue) ? tactic.tile_n / 2 : tactic.tile_n;
  args.n_blocks = ceil_div(args.n_out, out_cols);
  if (tactic.wgmma) {
    launch_wgmma_gemm(args, tactic, max_tiles, stream);
    return;
  }
  const long long blocks = static_cast<long long>(max_tiles) * args.n_blocks;
  require(blocks <= INT_MAX, who, "max_tiles x column blocks = " + std::to_string(blocks) +
                                      " exceeds the grid limit");

  const CompiledTactic c = compiled_tactic(index);
  UNIMOE_CUDA_CHECK(cudaFuncSetAttribute(c.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         c.smem_bytes));
  launch_pdl(c.kernel, static_cast<unsigned>(blocks), c.threads, c.smem_bytes, stream, args);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace

const GemmTactic* gemm_tactics(int* count) {
  if (count != nullptr) *count = kNumTactics;
  return kTactics;
}

void launch_gemm1(const Gemm1Params& p, const GemmTactic& tactic, KernelStream stream) {
  require(p.top_k > 0, "launch_gemm1", "top_k is " + std::to_string(p.top_k) + "; must be > 0");
  require(p.permuted_to_expanded != nullptr || p.max_tiles == 0, "launch_gemm1",
          "permuted_to_expanded is null");
  GroupedGemmArgs args;
  args.a = p.x;
  args.gather = p.permuted_to_expanded;
  args.top_k = p.top_k;
  args.b = p.w13;
  args.bias = p.b13;
  args.epilogue = gemm1_epilogue(p.activation);
  args.b_rows = is_gated(args.epilogue) ? 2 * p.intermediate : p.intermediate;
  args.tiles = p.tiles;
  args.num_tiles = p.num_tiles;
  args.k = p.hidden;
  args.n_out = p.intermediate;
  args.up_offset = p.intermediate;
  args.alpha = p.swiglu_alpha;
  args.limit = p.swiglu_limit;
  args.out = p.act_out;
  args.early_dependents = p.trigger_dependents_early;
  launch_grouped_gemm(args, tactic, p.max_tiles, {p.stream_max_splits, p.stream_one_token}, stream,
                      "launch_gemm1");
}

void launch_gemm2(const Gemm2Params& p, const GemmTactic& tactic, KernelStream stream) {
  GroupedGemmArgs args;
  args.a = p.act;
  args.b = p.w2;
  args.bias = p.b2;
  args.b_rows = p.hidden;
  args.tiles = p.tiles;
  args.num_tiles = p.num_tiles;
  args.k = p.intermediate;
  args.n_out = p.hidden;
  args.epilogue = GemmEpilogue::Identity;
  args.out = p.y;
  args.prefetch_before_wait = p.schedule_ready_before_wait;
  args.early_dependents = p.trigger_dependents_early;
  launch_grouped_gemm(args, tactic, p.max_tiles, {p.stream_max_splits, p.stream_one_token}, stream,
                      "launch_gemm2");
}

}  // namespace unimoe
