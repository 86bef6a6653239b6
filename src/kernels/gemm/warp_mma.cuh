// Warp-level building blocks of the sm_80-style tensor-core GEMMs (which run
// on Hopper at a fraction of wgmma's rate but need no warp-group machinery):
// 16-byte cp.async with zero fill, ldmatrix, mma.sync m16n8k16 bf16 with fp32
// accumulation, and the XOR swizzle of 128-byte shared-memory rows.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace unimoe {

// One shared-memory row holds 64 bf16 of K: eight 16-byte chunks. Chunk c of
// row r lives at chunk (c ^ (r % 8)), so the eight rows an ldmatrix phase
// reads (same logical chunk, consecutive rows) hit eight different bank groups.
inline constexpr int kSwizzleRowBytes = 128;

__device__ __forceinline__ uint32_t swizzled_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * kSwizzleRowBytes + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies src_bytes (16 or 0) from global to shared and zero-fills the rest of
// the 16 bytes; with 0 nothing is read, but src must still be a valid address.
// .cg: cached in L2 only, since every operand tile is read once per CTA.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// c += a * b for one m16n8k16 tile: a row-major (M x K), b column-major (K x N).
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4],
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The one-token paths' reduction (both stream kernels): the warp is cut
// into units of kUnitLanes lanes (the BF16 kernel: one unit of 32).
// u[s] holds one lane's share of slot s (two floats). Within each unit,
// afterwards unit lane i holds the unit's sum of slot i / (kUnitLanes /
// kSlots) in u[0]: each level halves the slots a lane keeps (it sends the
// half its partner keeps and adds what the partner sends), then plain
// butterflies; partners stay in the unit. A fixed order: deterministic.
template <int kSlots, int kUnitLanes>
__device__ __forceinline__ void reduce_slots(float (&u)[kSlots][2], int lane) {
  static_assert(kSlots <= kUnitLanes && (kSlots & (kSlots - 1)) == 0, "a power of two");
  int mask = kUnitLanes / 2;
#pragma unroll
  for (int n = kSlots; n > 1; n /= 2, mask /= 2) {
    const bool upper = (lane & mask) != 0;
#pragma unroll
    for (int j = 0; j < n / 2; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float send = upper ? u[j][h] : u[j + n / 2][h];
        const float keep = upper ? u[j + n / 2][h] : u[j][h];
        u[j][h] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
      }
  }
#pragma unroll
  for (; mask >= 1; mask /= 2)
#pragma unroll
    for (int h = 0; h < 2; ++h) u[0][h] += __shfl_xor_sync(0xffffffffu, u[0][h], mask);
}

}  // namespace unimoe
