// DeepSeek's fp32 score s = sigmoid(x) = 1 / (1 + exp(-x)), as one fixed
// sequence of IEEE fp32 operations (fma, multiply, add, floor, one
// reciprocal, each rounded to nearest, and an exponent add), so that the
// CPU reference and every kernel form the same bits: selection keys that
// tie on one side tie on the other, and the ids agree exactly.
//
// Properties (tests/cpu/test_sigmoid_fp32.cpp; every fp32 input checked
// once on the CPU, docs/routing.md):
//   - within 2 ulp of the exact sigmoid wherever that is a normal float
//     (x > -87.33); below about -87.34, 0 (the exact value is under 2^-126:
//     subnormal results are flushed);
//   - non-decreasing in x, so keys without bias order like the logits.
//
// exp(z), z = -x: n = floor(z / ln 2) (moved by one where the rounded
// quotient crossed an integer), r = z - n ln 2 in [0, ln 2] (two-part ln 2),
// exp(r) by a degree-6 polynomial capped at 2, times 2^n by an exponent
// add, exact but where exp(z) overflows (z is clamped where exp(z) would
// be subnormal: 1 + exp(z) is 1 there); then the reciprocal of 1 + exp(z),
// flushed to 0 where it is subnormal. With r >= 0 every Horner step adds
// and multiplies non-negative, increasing terms, and the cap keeps each
// 2^n band below the next: that is what makes the result monotone.
//
// Why this form: fp32 throughout (not a double exp rounded to fp32), so the
// device forms the same bits cheaply; subnormal results are flushed, so the
// device reciprocal needs no slow path; a fitted degree-6 polynomial and an
// exponent add take 4 fewer instructions a key than a degree-9 Taylor
// polynomial and a multiply by 2^n (0.26% of all fp32 inputs differ between
// the two forms, each by at most 3 ulp).
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
// 1 / a rounded to nearest for 2^-126 <= a < 2^126 (the same value as the
// division 1 / a): the fast path that ptxas emits for rcp.rn.f32 on such
// inputs, MUFU.RCP and one FMA correction, without rcp.rn's test for the
// other inputs and the call of its slow path. With rcp.rn that branch sits
// in every key, so a kernel cannot overlap one key's chain with the next (a
// lane of the octet kernel computes its 32 keys one after another).
__device__ __forceinline__ float rcp_rn(float a) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  const float e = __fmaf_rn(a, r, -1.0f);
  return __fmaf_rn(r, -e, r);
}
__device__ __forceinline__ float floor_f(float a) { return floorf(a); }
// max(a, b), NaN where a is NaN (b is a number).
__device__ __forceinline__ float max_or_nan(float a, float b) {
  float m;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b));
  return m;
}
// min(a, b), b where a is NaN (b is a number).
__device__ __forceinline__ float min_or_b(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ float from_bits(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint32_t to_bits(float f) { return __float_as_uint(f); }
#else
inline float fma_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float mul_rn(float a, float b) { return a * b; }
inline float add_rn(float a, float b) { return a + b; }
inline float rcp_rn(float a) { return 1.0f / a; }
inline float floor_f(float a) { return std::floor(a); }
inline float max_or_nan(float a, float b) { return a != a || a > b ? a : b; }
inline float min_or_b(float a, float b) { return a < b ? a : b; }
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
#endif


}  // namespace sigmoid_fp32_detail

// sigmoid(x) in fp32; NaN gives 0 (a NaN logit counts as -inf), sigmoid(-inf)
// = 0, sigmoid(+inf) = 1.
UNIMOE_HD float sigmoid_fp32(float x) {
  using namespace sigmoid_fp32_detail;
  // z = -x clamped to [-87, 88]: below -87, 1 + exp(z) rounds to 1 in fp32
  // (exp(-87) < 2^-125); above 88, 1 + exp(z) >= 2^126 and the result is 0
  // (below); so neither bound changes the result, and n stays within
  // [-127, 127]. NaN takes the upper end: the first bound keeps it, the
  // second replaces it (two instructions on the device, no test).
  const float z = min_or_b(max_or_nan(-x, -87.0f), 88.0f);
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
  // exp(r) on [0, ln 2]: a degree-6 polynomial fitted to the relative error
  // (near minimax, 1.25e-8 with these fp32 coefficients in exact
  // arithmetic), p(0) = 1, every coefficient positive.
  float p = 0x1.fedbbep-10f;
  p = fma_rn(p, r, 0x1.feaca4p-8f);
  p = fma_rn(p, r, 0x1.575e1cp-5f);
  p = fma_rn(p, r, 0x1.5537b2p-3f);
  p = fma_rn(p, r, 0x1.0000c4p-1f);
  p = fma_rn(p, r, 0x1.fffffap-1f);
  p = fma_rn(p, r, 1.0f);
  p = p > 2.0f ? 2.0f : p;
  // p 2^n by adding n to p's exponent field (p in [1, 2]): exact for n in
  // [-126, 127] (+inf where p = 2 and n = 127, as exp(z) overflows there);
  // at n = -127 a tiny wrong value, which 1 + e rounds away as it would the
  // exact one.
  const float e = from_bits(to_bits(p) + (static_cast<uint32_t>(static_cast<int>(n)) << 23));
  // 1 / (1 + e) where that is a normal float; 0 where it would be
  // subnormal (1 + e >= 2^126: x below about -87.34, the exact value under
  // 2^-126) or 1 + e is +inf. With no subnormal result the reciprocal needs
  // no slow path on the device (rcp_rn).
  const float a = add_rn(1.0f, e);
  return a < 0x1p126f ? rcp_rn(a) : 0.0f;
}

}  // namespace unimoe
