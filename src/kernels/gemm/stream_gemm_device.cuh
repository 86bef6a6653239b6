// The stream (swap-AB) GEMM's inner loop, shared by the stream kernel
// (stream_gemm.cu) and the combining GEMM2 (gemm2_combine.cu): a warp's 16
// weight rows times up to 16 token rows over a K range, weights loaded from
// HBM straight into registers. stream_gemm.cu's header comment explains the
// fragment layout.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gemm/warp_mma.cuh"

namespace unimoe {
namespace stream_device {

constexpr int kUnroll = 4;  // 32-wide K slabs in flight together (8 for 8-row tiles)
constexpr int kSlab = 32;   // K per slab: 4 lanes x 8 values

// Weights are read once: bypass L1. The multi-row path's loads cover 64
// bytes of a row each and take the L2 hint to fetch the whole 128-byte line
// (kLine128): `--stream-patterns` (H200) read 16 rows x 64 B at 3.72
// TB/s with the hint against 3.32 without (59 MB; 3.13 against 2.88 at 29
// MB). The one-token path's 512-byte pieces take no hint: .L2::256B made
// the layer slower (dsv3-tp8 T=1 33.7 against 32.7 us, qwen3-235b-a22b
// T=8 463.8 against 444.5, measured on an H200).
template <bool kLine128>
__device__ __forceinline__ uint4 load_weights(const uint16_t* p) {
  uint4 v;
  if constexpr (kLine128)
    asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
  else
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// acc[f] += this warp's 16 weight rows x token fragment f over K in
// [k_begin, k_end), kFrags fragments, kSlabs 32-wide K slabs of loads in
// flight at a time. k_end is a multiple of 8, so a lane's 8 values are all
// in or all out.
template <int kFrags, int kSlabs, bool kLine128>
__device__ __forceinline__ void stream_k_range(const uint16_t* w_lo, const uint16_t* w_hi,
                                               bool lo_ok, bool hi_ok,
                                               const uint16_t* const (&x_row)[2],
                                               const bool (&x_ok)[2], int k_begin, int k_end,
                                               int t, float (&acc)[2][4]) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int k0 = k_begin; k0 < k_end; k0 += kSlab * kSlabs) {
    uint4 wl[kSlabs], wh[kSlabs], xv[kSlabs][kFrags];
#pragma unroll
    for (int u = 0; u < kSlabs; ++u) {
      const int k = k0 + u * kSlab;
      const bool k_ok = k + 8 * t < k_end;
      wl[u] = k_ok && lo_ok ? load_weights<kLine128>(w_lo + k) : zero;
      wh[u] = k_ok && hi_ok ? load_weights<kLine128>(w_hi + k) : zero;
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
        xv[u][f] = k_ok && x_ok[f] ? __ldg(reinterpret_cast<const uint4*>(x_row[f] + k)) : zero;
    }
#pragma unroll
    for (int u = 0; u < kSlabs; ++u)
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        const uint32_t a[4] = {word(wl[u], 2 * step), word(wh[u], 2 * step),
                               word(wl[u], 2 * step + 1), word(wh[u], 2 * step + 1)};
#pragma unroll
        for (int f = 0; f < kFrags; ++f)
          mma_bf16_16816(acc[f], a, word(xv[u][f], 2 * step), word(xv[u][f], 2 * step + 1));
      }
  }
}

}  // namespace stream_device
}  // namespace unimoe
