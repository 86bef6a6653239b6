// What the wgmma kernels (sm90_wgmma_gemm.cu, sm90_fp8_wgmma_gemm.cu,
// sm90_w4_wgmma_gemm.cu) share: the shared-memory descriptor of their
// 128-byte-swizzled K-major operands, the fences, the cp.async pipeline, and
// the bf16 main loop and epilogue of the two bf16-operand kernels. sm_90a
// only.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include "kernels/gemm/tile_operands.cuh"
#include "kernels/gemm/warp_mma.cuh"

namespace unimoe {

// Shared memory of a swizzled operand starts on a 128-byte swizzle atom (8
// rows of 128 bytes), so that the hardware's XOR of address bits [7, 10)
// into [4, 7) is the software layout of swizzled_offset (warp_mma.cuh).
inline constexpr int kSmemAlign = 1024;

// The first swizzle atom in the dynamic shared memory at `raw` (which
// has kSmemAlign bytes to spare): its shared address; *aligned points at it.
__device__ __forceinline__ uint32_t align_to_swizzle_atom(uint8_t* raw, uint8_t** aligned) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  const uint32_t base = (address + kSmemAlign - 1) & ~static_cast<uint32_t>(kSmemAlign - 1);
  *aligned = raw + (base - address);
  return base;
}

// wgmma's shared-memory descriptor of a K-major operand in 128-byte
// swizzled rows: 8-row atoms 1024 bytes apart; the leading offset is unused
// by swizzled K-major layouts (1 by convention).
__device__ __forceinline__ uint64_t sw128_descriptor(uint32_t address) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>((address & 0x3FFFF) >> 4);
  d.bitfield.leading_byte_offset_ = 1;
  d.bitfield.stride_byte_offset_ = 1024 >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = static_cast<uint8_t>(cute::SM90::GMMA::LayoutType::B128);
  return d.desc_;
}

template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(d[i]);
}

__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The wgmma kernels' cp.async pipeline: kStages slots of kStageBytes from
// `base`, filled by `loader` (TileOperandLoader). Loads run kStages - 2 K
// blocks ahead of the MMAs and one wgmma batch stays in flight while the
// next is issued, so a slot is refilled only after the barrier that
// follows every thread's wait for the batch that last read it.
template <int kStages, int kStageBytes, class Loader, class Args>
struct WgmmaPipeline {
  static_assert(kStages >= 3, "loads run kStages - 2 blocks ahead of the MMA");
  static_assert(kStageBytes % kSmemAlign == 0, "every slot starts on a swizzle atom");
  const Loader& loader;
  const Args& args;
  uint32_t base;
  int k_tiles;

  __device__ __forceinline__ void prologue() const {
#pragma unroll
    for (int s = 0; s < kStages - 2; ++s) {
      if (s < k_tiles) loader.load(args, base + s * kStageBytes, s);
      cp_async_commit();
    }
  }

  // Block k_tile's slot, once this thread's copies of it have landed, are
  // visible to wgmma (the async proxy) and every thread has passed the same
  // point: then every thread's MMAs of block k_tile - 2 are done, and its
  // slot takes block k_tile + kStages - 2. Call once per block, in order,
  // with a wait for all but the last wgmma batch after each block's MMAs.
  __device__ __forceinline__ uint32_t acquire(int k_tile) const {
    cp_async_wait<kStages - 3>();
    fence_proxy_async_shared();
    __syncthreads();
    const int next = k_tile + kStages - 2;
    if (next < k_tiles) loader.load(args, base + (next % kStages) * kStageBytes, next);
    cp_async_commit();
    return base + (k_tile % kStages) * kStageBytes;
  }
};

// The wgmma kernels' CTA: two warp groups, 64 rows each.
inline constexpr int kWgmmaTileM = 128;
inline constexpr int kWgmmaThreads = 256;

template <int TileN>
struct Bf16Wgmma;
template <>
struct Bf16Wgmma<128> {
  using Op = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
};
template <>
struct Bf16Wgmma<256> {
  using Op = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
};

// d += A(64 x 16) * B(TileN x 16)^T, the accumulators as one array.
template <int TileN, std::size_t... I>
__device__ __forceinline__ void bf16_wgmma_k16(float (&d)[TileN / 2], uint64_t a, uint64_t b,
                                               std::index_sequence<I...>) {
  Bf16Wgmma<TileN>::Op::fma(a, b, d[I]..., cute::SM90::GMMA::ScaleOut::One);
}

// One K block of the bf16 main loop: this warp group's 64 rows of A (from
// row 64 * group of the stage at shared address `stage`) times the stage's
// TileN B rows, accumulated in acc. Returns once every wgmma batch but this
// one is complete, so the batch before no longer reads its stage.
template <int TileN>
__device__ __forceinline__ void bf16_wgmma_block(uint32_t stage, int group, float (&acc)[TileN / 2]) {
  constexpr auto kIndex = std::make_index_sequence<TileN / 2>{};
  const uint32_t a = stage + group * 64 * kSwizzleRowBytes;
  const uint32_t b = stage + kWgmmaTileM * kSwizzleRowBytes;
  fence_accumulators(acc);
  cute::warpgroup_arrive();
#pragma unroll
  for (int kk = 0; kk < kTileBlockK / 16; ++kk)  // 16 K values: 32 bytes along the swizzled row
    bf16_wgmma_k16<TileN>(acc, sw128_descriptor(a + kk * 32), sw128_descriptor(b + kk * 32), kIndex);
  cute::warpgroup_commit_batch();
  cute::warpgroup_wait<1>();
  fence_accumulators(acc);
}

// The bf16 main loop over every K block of the pipeline (bf16_wgmma_block
// on each stage), accumulated in acc from zero; one wgmma batch in flight
// while the next is issued. Every wgmma is complete on return.
template <int TileN, class Pipe>
__device__ __forceinline__ void bf16_wgmma_mainloop(const Pipe& pipe, int k_tiles, int group, float (&acc)[TileN / 2]) {
#pragma unroll
  for (int i = 0; i < TileN / 2; ++i) acc[i] = 0.0f;
  for (int k_tile = 0; k_tile < k_tiles; ++k_tile) bf16_wgmma_block<TileN>(pipe.acquire(k_tile), group, acc);
  cute::warpgroup_wait<0>();
  fence_accumulators(acc);
}

// scale * acc, with bias and activation, as bf16 into the staged tile
// (kWgmmaTileM rows of `stride`) by thread `tid` of the two multiplying
// warp groups: warp w of a group holds rows 16w + g and 16w + g + 8 (g =
// lane / 4) of the group's 64 and, in each n8 block j, columns 8j +
// 2(lane % 4) + {0, 1}.
template <int TileN>
__device__ __forceinline__ void stage_wgmma_accumulators(const GroupedGemmArgs& args, const TileWork& work,
                                                         const float* bias, float scale,
                                                         const float (&acc)[TileN / 2], __nv_bfloat16* staged,
                                                         int stride, int tid) {
  const int lane = tid % 32;
  const int row0 = (tid / 128) * 64 + ((tid % 128) / 32) * 16 + (lane >> 2);
  const int col0 = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < TileN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      stage_output_pair(args, bias, work.gated, work.n0, staged, stride, row0 + 8 * h, 8 * j + col0,
                        scale * acc[4 * j + 2 * h], scale * acc[4 * j + 2 * h + 1]);
}

// The epilogue of a bf16 output from wgmma accumulators (the mma.sync
// kernel's, tile_operands.cuh): the accumulators staged
// (stage_wgmma_accumulators) and stored. Waits for every thread's copies
// and MMAs before it writes the staging area.
template <int TileN>
__device__ __forceinline__ void bf16_wgmma_epilogue(const GroupedGemmArgs& args, const TileWork& work,
                                                    const float* bias, float scale, const float (&acc)[TileN / 2],
                                                    __nv_bfloat16* staged, int stride) {
  cp_async_wait<0>();
  __syncthreads();
  const int tid = threadIdx.x;
  stage_wgmma_accumulators<TileN>(args, work, bias, scale, acc, staged, stride, tid);
  __syncthreads();
  store_staged_tile<kWgmmaTileM, kWgmmaThreads>(args, work.tile, staged, stride, work.n0, work.out_cols, tid);
}

}  // namespace unimoe
