// The W4A16 grouped GEMM's wgmma form (contract: stream_gemm_w4.cuh, tile_m
// w4_wgmma_tile_m).
//
// A CTA computes one 128-row x 256-B-row (tile, column block) work item with
// wgmma m64n256k16 from 128-byte-swizzled shared memory, in three warp
// groups with their own work (warp specialization):
// - the producer (warp group 0) fills a ring of kStages stages, each one
//   64-wide K block: the tile's A rows (token rows, gathered for GEMM1) by
//   cp.async, and the B rows, whose codes and block scales each thread loads
//   from global memory two blocks ahead into registers, dequantizes
//   (w4_dequant.cuh: exact bf16, the block scale applied) and stores into
//   the stage's swizzled B rows. Once a stage's copies have landed (kLag
//   blocks later), each producer thread fences them for the async proxy and
//   arrives on the stage's `full` barrier;
// - the two consumers (warp groups 1 and 2, 64 A rows each) wait for a
//   stage's `full` barrier, issue its four wgmma k16 steps, keep one batch
//   in flight, and give the stage of the batch before back through its
//   `empty` barrier (one arrival a warp), which the producer waits for
//   before it refills the stage.
// So the dequantization of later blocks runs while the tensor cores work
// on earlier ones. Gate and up rows interleave as in the other tiled
// kernels, so the activation runs on the accumulators in the consumers'
// epilogue (tile_operands.cuh), after NVFP4's matrix scale (times 2^9,
// w4_dequant.cuh) scales the sums; the staging area of the epilogue reuses
// the ring once both consumers are done with it.
#include "kernels/gemm/sm90_w4_wgmma_gemm.cuh"

#include <cuda_bf16.h>

#include <climits>
#include <cstddef>
#include <stdexcept>
#include <string>
#include "kernels/common/cluster_handoff.cuh"
#include "kernels/gemm/grouped_gemm_args.cuh"
#include "kernels/gemm/sm90_wgmma_util.cuh"
#include "kernels/gemm/tile_operands.cuh"
#include "kernels/gemm/w4_dequant.cuh"

namespace unimoe {
namespace {

constexpr int kTileM = kWgmmaTileM;
constexpr int kTileN = 256;  // B rows a CTA: 128 gated output columns, or 256 plain ones
constexpr int kProducerThreads = 128;
constexpr int kConsumerThreads = kWgmmaThreads;  // two warp groups
constexpr int kThreads = kProducerThreads + kConsumerThreads;
constexpr int kStages = 4;
constexpr int kLag = 2;  // K blocks between a stage's copies and its `full` arrival
constexpr int kAccum = kTileN / 2;  // fp32 accumulators a consumer thread: 64 x 256 / 128
constexpr int kHalfRows = 2 * kTileN / kProducerThreads;  // half rows of B a producer thread dequantizes per K block
constexpr int kStageBytes = (kTileM + kTileN) * kSwizzleRowBytes;
constexpr int kStagedStride = kTileN + 8;  // bf16 epilogue staging, rows padded by 16 bytes
constexpr int kStagedBytes = kTileM * kStagedStride * 2;
constexpr int kSmemBytes = (kStages * kStageBytes > kStagedBytes ? kStages * kStageBytes : kStagedBytes) + kSmemAlign;
constexpr uint32_t kConsumerBarrier = 1;  // named barrier of the two consumer warp groups
static_assert(kTileM == w4_wgmma_tile_m, "the contract's M tile");
static_assert(2 * kTileN % kProducerThreads == 0, "every producer thread owns whole half rows");
static_assert(kStages > kLag, "a stage is published before the producer comes back to it");

__device__ __forceinline__ void store_shared_v4(uint32_t address, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}

__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.release.cta.shared::cta.b64 state, [%0];\n}\n" ::"r"(
                   smem_address(bar))
               : "memory");
}

// Blocks until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "wait_%=:\n"
      " mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra wait_%=;\n}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}

// One K block of a thread's half rows, loaded and not yet dequantized.
struct HalfRows {
  uint4 codes[kHalfRows];
  uint32_t scales[kHalfRows];
};

// The producer's B rows: load(k) must be called for K blocks 0, 1, 2, ... in
// order: block k's codes were fetched by load(k - 2) (by the constructor for
// blocks 0 and 1), into the register set of k's parity.
struct W4Loader {
  W4Format format;
  int k;                  // K values
  int block_values;       // K values a scale covers
  const uint8_t* code[kHalfRows];   // the half row's codes in K block 0 (2 values a byte)
  const uint8_t* scale[kHalfRows];  // its scale byte(s) in K block 0
  uint32_t valid = 0;     // bit i: half row i is a B row of the call (column < n_out)
  int half;               // K values 32 * half .. 32 * half + 31 of each block
  int ptid;               // producer thread 0..127
  mutable HalfRows even, odd;

  __device__ __forceinline__ W4Loader(const W4StreamGemmParams& p, int scale_stride, const DeviceTile& tile,
                                      bool gated, int n0, int producer_tid)
      : format(p.format), k(p.k), block_values(w4_block_values(p.format)), ptid(producer_tid) {
    half = ptid & 1;
#pragma unroll
    for (int i = 0; i < kHalfRows; ++i) {
      const int j = (ptid >> 1) + i * (kProducerThreads / 2);  // the B row of the tile
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
      const int row = (ptid >> 1) + i * (kProducerThreads / 2);
#pragma unroll
      for (int c = 0; c < 4; ++c)
        store_shared_v4(stage + kTileM * kSwizzleRowBytes + swizzled_offset(row, 4 * half + c), d[4 * c],
                        d[4 * c + 1], d[4 * c + 2], d[4 * c + 3]);
    }
  }

  __device__ __forceinline__ void load(uint32_t stage, int k_tile) const {
    if (k_tile & 1) {
      store(stage, odd);
      fetch(k_tile + 2, odd);
    } else {
      store(stage, even);
      fetch(k_tile + 2, even);
    }
  }
};

// Warp group 0: every stage of every K block, then the last kLag arrivals.
__device__ __forceinline__ void produce(const W4StreamGemmParams& p, const GroupedGemmArgs& view, int scale_stride,
                                        const TileWork& work, int k_tiles, uint32_t smem_base, uint64_t* full,
                                        uint64_t* empty) {
  const int ptid = threadIdx.x;
  const TileRowsLoader<kProducerThreads, kTileM> rows(view, work.tile, ptid);
  const W4Loader weights(p, scale_stride, work.tile, work.gated, work.n0, ptid);
  for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
    const int s = k_tile % kStages;
    // The consumers' batch of this stage's previous round is complete.
    if (k_tile >= kStages) barrier_wait(&empty[s], static_cast<uint32_t>((k_tile / kStages - 1) & 1));
    const uint32_t stage = smem_base + s * kStageBytes;
    rows.load(view, stage, k_tile);
    cp_async_commit();
    weights.load(stage, k_tile);
    if (k_tile >= kLag) {
      cp_async_wait<kLag>();
      fence_proxy_async_shared();
      barrier_arrive(&full[(k_tile - kLag) % kStages]);
    }
  }
  cp_async_wait<0>();
  fence_proxy_async_shared();
  for (int k_tile = k_tiles > kLag ? k_tiles - kLag : 0; k_tile < k_tiles; ++k_tile)
    barrier_arrive(&full[k_tile % kStages]);
}

// Warp groups 1 and 2: 64 A rows each times the stage's 256 B rows.
__device__ __forceinline__ void consume(int k_tiles, int group, uint32_t smem_base, uint64_t* full, uint64_t* empty,
                                        float (&acc)[kAccum]) {
#pragma unroll
  for (int i = 0; i < kAccum; ++i) acc[i] = 0.0f;
  const bool warp_leader = threadIdx.x % 32 == 0;
  for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
    const int s = k_tile % kStages;
    barrier_wait(&full[s], static_cast<uint32_t>((k_tile / kStages) & 1));
    bf16_wgmma_block<kTileN>(smem_base + s * kStageBytes, group, acc);
    // The batch of block k_tile - 1 is complete: its stage goes back.
    if (k_tile > 0 && warp_leader) barrier_arrive(&empty[(k_tile - 1) % kStages]);
  }
  cute::warpgroup_wait<0>();
  fence_accumulators(acc);
}

__global__ void __launch_bounds__(kThreads, 1)
    w4_wgmma_gemm_kernel(const W4StreamGemmParams p, const GroupedGemmArgs view, int scale_stride) {
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ __align__(8) uint64_t empty[kStages];
  pdl_begin();
  TileWork work;
  if (!tile_work(p.tiles, p.num_tiles, view.n_blocks, p.epilogue, kTileN, work)) return;

  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem;
  const uint32_t smem_base = align_to_swizzle_atom(smem_raw, &smem);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      handoff_init(&full[s], kProducerThreads);  // mbarrier.init, then its fence
      handoff_init(&empty[s], kConsumerThreads / 32);
    }
  }
  __syncthreads();

  const int k_tiles = (p.k + kTileBlockK - 1) / kTileBlockK;
  if (threadIdx.x < kProducerThreads) {
    produce(p, view, scale_stride, work, k_tiles, smem_base, full, empty);
    return;
  }
  const int ctid = threadIdx.x - kProducerThreads;
  float acc[kAccum];
  consume(k_tiles, ctid / 128, smem_base, full, empty, acc);
  const float g = p.b_global != nullptr ? p.b_global[work.tile.expert] * 0x1p9f : 1.0f;  // NVFP4: undo the 2^-9
  const float* bias = p.bias != nullptr ? p.bias + static_cast<size_t>(work.tile.expert) * p.b_rows : nullptr;

  // Both consumers are done with the ring (and the producer's copies all
  // landed before its last arrivals): it becomes the staging area.
  asm volatile("bar.sync %0, %1;\n" ::"r"(kConsumerBarrier), "r"(kConsumerThreads) : "memory");
  __nv_bfloat16* staged = reinterpret_cast<__nv_bfloat16*>(smem);
  stage_wgmma_accumulators<kTileN>(view, work, bias, g, acc, staged, kStagedStride, ctid);
  asm volatile("bar.sync %0, %1;\n" ::"r"(kConsumerBarrier), "r"(kConsumerThreads) : "memory");
  store_staged_tile<kTileM, kConsumerThreads>(view, work.tile, staged, kStagedStride, work.n0, work.out_cols, ctid);
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
