// DeepSeek's fp32 score s = sigmoid(x) = 1 / (1 + exp(-x)), as one fixed
// sequence of IEEE fp32 operations (fma, multiply, add, floor, one
// reciprocal, each rounded to nearest), so that the CPU reference and every
// kernel form the same bits: selection keys that tie on one side tie on the
// other, and the ids agree exactly. It costs a kernel about half the instructions of an
// fp64 exp rounded to fp32, which DeepSeek's 256 keys a token paid before.
//
// Properties (tests/cpu/test_sigmoid_fp32.cpp; every fp32 input checked
// once on the CPU, docs/routing.md):
//   - within 3 ulp of the exact sigmoid wherever exp(-x) is finite in fp32
//     (x > -88.72); below that, 0 (the exact value is under 3e-39);
//   - non-decreasing in x, so keys without bias order like the logits.
//
// exp(z), z = -x: n = floor(z / ln 2) (moved by one where the rounded
// quotient crossed an integer), r = z - n ln 2 in [0, ln 2] (two-part ln 2),
// exp(r) by its Taylor polynomial of degree 9 (truncation below 0.1 ulp)
// capped at 2, times 2^n in one multiply, exact but where exp(z) overflows
// (z is clamped where exp(z) would be subnormal: 1 + exp(z) is 1 there).
// With r >= 0 every Horner step adds and multiplies non-negative,
// increasing terms, and the cap keeps each 2^n band below the next: that is
// what makes the result monotone.
//
// Device code calls the _rn intrinsics, which the compiler never contracts
// into other operations; host code calls std::fmaf and plain operators, and
// host C++ is built with -ffp-contract=off (CMakeLists.txt) so that no
// multiply and add are fused there either.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace unimoe {
namespace sigmoid_fp32_detail {

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
// 1 / a rounded to nearest: the same value as the division 1 / a (IEEE
// rounds both exactly), in fewer instructions than __fdiv_rn(1, a).
__device__ __forceinline__ float rcp_rn(float a) { return __frcp_rn(a); }
__device__ __forceinline__ float floor_f(float a) { return floorf(a); }
__device__ __forceinline__ float from_bits(uint32_t u) { return __uint_as_float(u); }
#else
inline float fma_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float mul_rn(float a, float b) { return a * b; }
inline float add_rn(float a, float b) { return a + b; }
inline float rcp_rn(float a) { return 1.0f / a; }
inline float floor_f(float a) { return std::floor(a); }
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
#endif

// 2^k for -126 <= k <= 127; +inf for k = 128.
UNIMOE_HD float pow2(int k) { return from_bits(static_cast<uint32_t>(k + 127) << 23); }

}  // namespace sigmoid_fp32_detail

// sigmoid(x) in fp32; NaN gives 0 (a NaN logit counts as -inf), sigmoid(-inf)
// = 0, sigmoid(+inf) = 1.
UNIMOE_HD float sigmoid_fp32(float x) {
  using namespace sigmoid_fp32_detail;
  // z = -x clamped to [-87, 89]: below -87, 1 + exp(z) rounds to 1 in fp32
  // (exp(-87) < 2^-125), above 89 exp(z) overflows, so the result is
  // unchanged; n stays within [-126, 128], where 2^n is a normal float (128:
  // +inf, and so is exp(z)). NaN takes the +inf end.
  float z = x != x ? 89.0f : -x;
  z = z < -87.0f ? -87.0f : (z > 89.0f ? 89.0f : z);
  constexpr float kInvLn2 = 1.44269502f;
  constexpr float kLn2Hi = 0.693145751953125f;  // ln 2 to 16 bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = 1.4286068e-6f;      // ln 2 - kLn2Hi, rounded
  constexpr float kLn2 = 0.693147182f;          // ln 2 rounded (up)
  auto reduce = [z](float n) { return fma_rn(n, -kLn2Lo, fma_rn(n, -kLn2Hi, z)); };
  // floor(z / ln 2) from the rounded quotient, then moved by one where that
  // crossed an integer: each step keeps n non-decreasing in z.
  float n = floor_f(mul_rn(z, kInvLn2));
  float r = reduce(n);
  if (r < 0.0f) {
    n = add_rn(n, -1.0f);
    r = reduce(n);
  }
  if (r >= kLn2) {
    n = add_rn(n, 1.0f);
    r = reduce(n);
  }
  r = r < 0.0f ? 0.0f : r;
  float p = 1.0f / 362880.0f;
  p = fma_rn(p, r, 1.0f / 40320.0f);
  p = fma_rn(p, r, 1.0f / 5040.0f);
  p = fma_rn(p, r, 1.0f / 720.0f);
  p = fma_rn(p, r, 1.0f / 120.0f);
  p = fma_rn(p, r, 1.0f / 24.0f);
  p = fma_rn(p, r, 1.0f / 6.0f);
  p = fma_rn(p, r, 0.5f);
  p = fma_rn(p, r, 1.0f);
  p = fma_rn(p, r, 1.0f);
  p = p > 2.0f ? 2.0f : p;
  // p in [1, 2] and 2^n normal: p 2^n is exact unless it overflows, where
  // its one rounding gives +inf as exp(z)'s would.
  const float e = mul_rn(p, pow2(static_cast<int>(n)));
  return rcp_rn(add_rn(1.0f, e));
}

}  // namespace unimoe
