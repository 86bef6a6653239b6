// Gather, scatter and activation row kernels (contract: expert_rows.cuh). One warp
// per row, 8 bf16 values (16 bytes) per lane and step; blocks of
// kRowsPerBlock rows, the grid sized from the capacity.
#include <cuda_bf16.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/e4m3.h"
#include "kernels/common/common.cuh"
#include "kernels/epilogue/activation.cuh"
#include "kernels/permute/expert_rows.cuh"
#include "kernels/quant/fp8_amax.cuh"

namespace unimoe {
namespace {

constexpr int kWarpSize = 32;
constexpr int kRowsPerBlock = 8;
constexpr int kThreads = kRowsPerBlock * kWarpSize;
constexpr int kVec = 8;  // bf16 values in 16 bytes

// Permuted row of this warp.
__device__ __forceinline__ int warp_row() {
  return blockIdx.x * kRowsPerBlock + static_cast<int>(threadIdx.x) / kWarpSize;
}

__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const uint4* __restrict__ x, const int32_t* __restrict__ permuted_to_expanded,
                       const int32_t* __restrict__ expert_offsets, int num_groups, int top_k,
                       int vecs_per_row, uint4* __restrict__ out) {
  pdl_begin();
  const int row = warp_row();
  if (row >= expert_offsets[num_groups]) return;
  const int token = permuted_to_expanded[row] / top_k;
  const uint4* src = x + static_cast<int64_t>(token) * vecs_per_row;
  uint4* dst = out + static_cast<int64_t>(row) * vecs_per_row;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll 4
  for (int v = lane; v < vecs_per_row; v += kWarpSize) dst[v] = src[v];
}

// One warp per token row t (warp_row() counts tokens here): each 16-byte
// piece of the row is loaded once and stored to the row's K destinations.
__global__ void __launch_bounds__(kThreads)
    scatter_rows_kernel(const uint4* __restrict__ x, const int32_t* __restrict__ expanded_to_permuted,
                        int num_tokens, int top_k, int vecs_per_row, uint4* __restrict__ out) {
  pdl_begin();
  const int token = warp_row();
  if (token >= num_tokens) return;
  const uint4* src = x + static_cast<int64_t>(token) * vecs_per_row;
  const int32_t* dst_rows = expanded_to_permuted + static_cast<int64_t>(token) * top_k;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll 2
  for (int v = lane; v < vecs_per_row; v += kWarpSize) {
    const uint4 value = src[v];
    for (int k = 0; k < top_k; ++k) {
      const int row = dst_rows[k];  // the same address in every lane
      if (row >= 0) out[static_cast<int64_t>(row) * vecs_per_row + v] = value;
    }
  }
}

// Expert of permuted row r: the last e with offsets[e] <= r. Empty experts
// repeat an offset, and the last of a run is the one whose rows follow.
__device__ __forceinline__ int expert_of_row(const int32_t* offsets, int num_groups, int row) {
  int lo = 0, hi = num_groups - 1;  // offsets[0] = 0 <= row, so the answer is in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ void unpack_bf16x8(const uint4& v, float (&f)[kVec]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(words[i] << 16);
    f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint4 pack_bf16x8(const float (&f)[kVec]) {
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i]));
    const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i + 1]));
    words[i] = lo | (hi << 16);
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

__device__ __forceinline__ void add_bias(float (&f)[kVec], const float* bias) {
  const float4 b0 = reinterpret_cast<const float4*>(bias)[0];
  const float4 b1 = reinterpret_cast<const float4*>(bias)[1];
  f[0] += b0.x; f[1] += b0.y; f[2] += b0.z; f[3] += b0.w;
  f[4] += b1.x; f[5] += b1.y; f[6] += b1.z; f[7] += b1.w;
}

// The activation of kernels/activation.cuh, chosen at compile time.
template <Activation kAct>
__device__ __forceinline__ float activate(float g, float u, float alpha, float limit) {
  if constexpr (kAct == Activation::SwiGLU) {
    return swiglu(g, u);
  } else if constexpr (kAct == Activation::GeGLU) {
    return geglu(g, u);
  } else if constexpr (kAct == Activation::SwiGLUOai) {
    return swiglu_oai(g, u, alpha, limit);
  } else {
    static_assert(kAct == Activation::ReLU2, "an activation without a formula");
    return relu2(g);
  }
}

struct ActivationArgs {
  const uint16_t* h;
  const float* h_f32;
  const float* b13;
  const int32_t* expert_offsets;
  int num_groups;
  int intermediate;
  float alpha;
  float limit;
  uint16_t* out;
  float* out_f32;
  float* amax_partials;
};

// Eight activated values to a bf16 row (16 bytes) or an fp32 one (32 bytes).
__device__ __forceinline__ void store8(uint16_t* row, int j, const float (&a)[kVec]) {
  *reinterpret_cast<uint4*>(row + j) = pack_bf16x8(a);
}
__device__ __forceinline__ void store8(float* row, int j, const float (&a)[kVec]) {
  reinterpret_cast<float4*>(row + j)[0] = make_float4(a[0], a[1], a[2], a[3]);
  reinterpret_cast<float4*>(row + j)[1] = make_float4(a[4], a[5], a[6], a[7]);
}

// Eight values of a bf16 row (16 bytes) or an fp32 one (32 bytes) from column j.
__device__ __forceinline__ void load8(const uint16_t* row, int j, float (&f)[kVec]) {
  unpack_bf16x8(*reinterpret_cast<const uint4*>(row + j), f);
}
__device__ __forceinline__ void load8(const float* row, int j, float (&f)[kVec]) {
  const float4 a = reinterpret_cast<const float4*>(row + j)[0];
  const float4 b = reinterpret_cast<const float4*>(row + j)[1];
  f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
  f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}

// a[0..7] = the activation of columns j..j+7 of a GEMM1 output row h_row
// (gate at j, up at intermediate + j for gated activations), each plus its
// bias where bias_row is given.
template <Activation kAct, typename In>
__device__ __forceinline__ void activate8(const In* h_row, const float* bias_row, int j,
                                          int intermediate, float alpha, float limit,
                                          float (&a)[kVec]) {
  float g[kVec];
  load8(h_row, j, g);
  if (bias_row) add_bias(g, bias_row + j);
  if constexpr (kAct != Activation::ReLU2) {
    float u[kVec];
    load8(h_row, intermediate + j, u);
    if (bias_row) add_bias(u, bias_row + intermediate + j);
#pragma unroll
    for (int i = 0; i < kVec; ++i) a[i] = activate<kAct>(g[i], u[i], alpha, limit);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) a[i] = activate<kAct>(g[i], 0.0f, alpha, limit);
  }
}

// One warp's row of gated_activation_kernel; with `amax`, the lane's
// largest magnitude of the values it wrote (else 0).
template <Activation kAct, typename In, typename Out>
__device__ __forceinline__ float activation_row(const ActivationArgs& p, int row, bool amax) {
  constexpr bool kGated = kAct != Activation::ReLU2;
  const int cols = kGated ? 2 * p.intermediate : p.intermediate;
  const In* h_row = [&] {
    if constexpr (std::is_same_v<In, float>) return p.h_f32 + static_cast<int64_t>(row) * cols;
    else return p.h + static_cast<int64_t>(row) * cols;
  }();
  const float* bias_row =
      p.b13 ? p.b13 + static_cast<int64_t>(expert_of_row(p.expert_offsets, p.num_groups, row)) * cols
            : nullptr;
  Out* out_row = [&] {
    if constexpr (std::is_same_v<Out, float>) return p.out_f32 + static_cast<int64_t>(row) * p.intermediate;
    else return p.out + static_cast<int64_t>(row) * p.intermediate;
  }();
  const int lane = threadIdx.x % kWarpSize;
  float m = 0.0f;
  for (int j = lane * kVec; j < p.intermediate; j += kWarpSize * kVec) {
    float a[kVec];
    activate8<kAct>(h_row, bias_row, j, p.intermediate, p.alpha, p.limit, a);
    store8(out_row, j, a);
    if (amax) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) m = fmaxf(m, fabsf(a[i]));
    }
  }
  return m;
}

template <Activation kAct, typename In, typename Out>
__global__ void __launch_bounds__(kThreads) gated_activation_kernel(ActivationArgs p) {
  pdl_begin();
  const int row = warp_row();
  if (p.amax_partials) {
    // Every warp reaches the CTA's reduction, a warp past the live rows
    // with 0 (block_max syncs the CTA).
    float m = 0.0f;
    if (row < p.expert_offsets[p.num_groups]) m = activation_row<kAct, In, Out>(p, row, true);
    m = fp8_amax::block_max<kRowsPerBlock>(m);
    if (threadIdx.x == 0) p.amax_partials[blockIdx.x] = m;
    return;
  }
  if (row >= p.expert_offsets[p.num_groups]) return;
  activation_row<kAct, In, Out>(p, row, false);
}

// The activation, then its quantization per row and 128 columns: a warp
// step covers 256 columns, lanes 0-15 one 128-column group and lanes 16-31
// the next, so a group's amax is a 16-lane reduction (fmaxf skips NaN and
// max is exact: the order does not matter, as in the quantize kernels).
// Steps are warp-uniform; a half past the row (I an odd multiple of 128)
// takes part in the shuffles with zeros and writes nothing.
template <Activation kAct>
__global__ void __launch_bounds__(kThreads) gated_activation_fp8_kernel(GatedActivationFp8Params p) {
  pdl_begin();
  constexpr bool kGated = kAct != Activation::ReLU2;
  constexpr int kGroup = 128;
  const int row = warp_row();
  if (row >= p.expert_offsets[p.num_groups]) return;
  const int cols = kGated ? 2 * p.intermediate : p.intermediate;
  const float* h_row = p.h_f32 + static_cast<int64_t>(row) * cols;
  const float* bias_row =
      p.b13 ? p.b13 + static_cast<int64_t>(expert_of_row(p.expert_offsets, p.num_groups, row)) * cols
            : nullptr;
  uint8_t* codes_row = p.out_codes + static_cast<int64_t>(row) * p.intermediate;
  const int lane = threadIdx.x % kWarpSize;
  const float given = p.static_scale ? *p.static_scale : 0.0f;
  for (int base = 0; base < p.intermediate; base += kWarpSize * kVec) {
    const int j = base + lane * kVec;
    const bool in_row = j < p.intermediate;
    float a[kVec] = {};
    float m = 0.0f;
    if (in_row) {
      activate8<kAct>(h_row, bias_row, j, p.intermediate, p.swiglu_alpha, p.swiglu_limit, a);
#pragma unroll
      for (int i = 0; i < kVec; ++i) m = fmaxf(m, fabsf(a[i]));
    }
    if (!p.static_scale) {  // uniform: every lane reduces, or none
#pragma unroll
      for (int d = kGroup / kVec / 2; d > 0; d /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
    }
    if (!in_row) continue;
    const float scale = p.static_scale ? given : fp8_amax::fp8_scale(m);
    uint32_t words[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < kVec; ++i)
      words[i / 4] |= static_cast<uint32_t>(encode_e4m3(__fdiv_rn(a[i], scale))) << (8 * (i % 4));
    *reinterpret_cast<uint2*>(codes_row + j) = make_uint2(words[0], words[1]);
    if (j % kGroup == 0) p.out_scales[static_cast<int64_t>(j / kGroup) * p.out_scales_ld + row] = scale;
  }
}

// One warp per permuted row: H bytes of codes (16 a lane and step), then the
// row's H / 128 scales, one a lane.
__global__ void __launch_bounds__(kThreads) gather_fp8_rows_kernel(GatherFp8RowsParams p) {
  pdl_begin();
  const int row = warp_row();
  if (row >= p.expert_offsets[p.num_groups]) return;
  const int token = p.permuted_to_expanded[row] / p.top_k;
  const int vecs = p.hidden / 16;
  const uint4* src = reinterpret_cast<const uint4*>(p.codes) + static_cast<int64_t>(token) * vecs;
  uint4* dst = reinterpret_cast<uint4*>(p.out_codes) + static_cast<int64_t>(row) * vecs;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll 4
  for (int v = lane; v < vecs; v += kWarpSize) dst[v] = src[v];
  for (int g = lane; g < p.hidden / 128; g += kWarpSize)
    p.out_scales[static_cast<int64_t>(g) * p.out_scales_ld + row] =
        p.scales[static_cast<int64_t>(g) * p.scales_ld + token];
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <typename In, typename Out>
void launch_activation(Activation activation, const ActivationArgs& args, int capacity,
                       KernelStream stream) {
  const dim3 grid(ceil_div(capacity, kRowsPerBlock));
  switch (activation) {
    case Activation::SwiGLU:
      launch_pdl(gated_activation_kernel<Activation::SwiGLU, In, Out>, grid, kThreads, 0, stream, args);
      break;
    case Activation::GeGLU:
      launch_pdl(gated_activation_kernel<Activation::GeGLU, In, Out>, grid, kThreads, 0, stream, args);
      break;
    case Activation::SwiGLUOai:
      launch_pdl(gated_activation_kernel<Activation::SwiGLUOai, In, Out>, grid, kThreads, 0, stream, args);
      break;
    case Activation::ReLU2:
      launch_pdl(gated_activation_kernel<Activation::ReLU2, In, Out>, grid, kThreads, 0, stream, args);
      break;
    default:
      throw std::invalid_argument("gated_activation: unknown activation " +
                                  std::to_string(static_cast<int>(activation)));
  }
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace

void launch_gather_rows(const GatherRowsParams& p, KernelStream stream) {
  require(p.hidden > 0 && p.hidden % kVec == 0,
          "gather_rows: hidden must be a positive multiple of 8, is " + std::to_string(p.hidden));
  require(p.top_k > 0 && p.num_groups >= 0 && p.capacity >= 0,
          "gather_rows: top_k must be positive, num_groups and capacity non-negative");
  if (p.capacity == 0) return;
  require(p.x && p.permuted_to_expanded && p.expert_offsets && p.out, "gather_rows: a null pointer");
  require(aligned16(p.x) && aligned16(p.out), "gather_rows: x and out must be 16-byte aligned");
  launch_pdl(gather_rows_kernel, ceil_div(p.capacity, kRowsPerBlock), kThreads, 0, stream,
      reinterpret_cast<const uint4*>(p.x), p.permuted_to_expanded, p.expert_offsets, p.num_groups,
      p.top_k, p.hidden / kVec, reinterpret_cast<uint4*>(p.out));
  UNIMOE_LAUNCH_CHECK();
}

void launch_scatter_rows(const ScatterRowsParams& p, KernelStream stream) {
  require(p.hidden > 0 && p.hidden % kVec == 0,
          "scatter_rows: hidden must be a positive multiple of 8, is " + std::to_string(p.hidden));
  require(p.top_k > 0 && p.num_tokens >= 0,
          "scatter_rows: top_k must be positive, num_tokens non-negative");
  if (p.num_tokens == 0) return;
  require(p.x && p.expanded_to_permuted && p.out, "scatter_rows: a null pointer");
  require(aligned16(p.x) && aligned16(p.out), "scatter_rows: x and out must be 16-byte aligned");
  launch_pdl(scatter_rows_kernel, ceil_div(p.num_tokens, kRowsPerBlock), kThreads, 0, stream,
      reinterpret_cast<const uint4*>(p.x), p.expanded_to_permuted, p.num_tokens, p.top_k,
      p.hidden / kVec, reinterpret_cast<uint4*>(p.out));
  UNIMOE_LAUNCH_CHECK();
}

int gated_activation_blocks(int capacity) { return ceil_div(capacity, kRowsPerBlock); }

void launch_gated_activation(const GatedActivationParams& p, KernelStream stream) {
  require(p.intermediate > 0 && p.intermediate % kVec == 0,
          "gated_activation: intermediate must be a positive multiple of 8, is " +
              std::to_string(p.intermediate));
  require(p.num_groups >= 0 && p.capacity >= 0,
          "gated_activation: num_groups and capacity must be non-negative");
  if (p.capacity == 0) return;
  require(p.expert_offsets && (p.h != nullptr) != (p.h_f32 != nullptr) &&
              (p.out != nullptr) != (p.out_f32 != nullptr),
          "gated_activation: a null pointer (expert_offsets, or not exactly one of h and h_f32, "
          "or of out and out_f32)");
  require(aligned16(p.h) && aligned16(p.h_f32) && aligned16(p.out) && aligned16(p.out_f32) &&
              aligned16(p.b13),
          "gated_activation: h, h_f32, out, out_f32 and b13 must be 16-byte aligned");
  require(!p.amax_partials || p.out_f32,
          "gated_activation: amax_partials are taken with the fp32 output (out_f32) only");
  const ActivationArgs args{p.h,           p.h_f32,        p.b13,          p.expert_offsets,
                            p.num_groups,  p.intermediate, p.swiglu_alpha, p.swiglu_limit,
                            p.out,         p.out_f32,      p.amax_partials};
  // The pairs the layer uses: bf16 in and out (BF16's Cutlass path), fp32
  // in and out (the FP8 Cutlass path); bf16 in, fp32 out serves tests.
  if (p.h_f32 && p.out_f32)
    launch_activation<float, float>(p.activation, args, p.capacity, stream);
  else if (p.h_f32)
    throw std::invalid_argument("gated_activation: fp32 h takes fp32 out (out_f32)");
  else if (p.out_f32)
    launch_activation<uint16_t, float>(p.activation, args, p.capacity, stream);
  else
    launch_activation<uint16_t, uint16_t>(p.activation, args, p.capacity, stream);
}

void launch_gated_activation_fp8(const GatedActivationFp8Params& p, KernelStream stream) {
  require(p.intermediate > 0 && p.intermediate % 128 == 0,
          "gated_activation_fp8: intermediate must be a positive multiple of 128, is " +
              std::to_string(p.intermediate));
  require(p.num_groups >= 0 && p.capacity >= 0,
          "gated_activation_fp8: num_groups and capacity must be non-negative");
  if (p.capacity == 0) return;
  require(p.h_f32 && p.expert_offsets && p.out_codes && p.out_scales,
          "gated_activation_fp8: a null pointer (h_f32, expert_offsets, out_codes or out_scales)");
  require(aligned16(p.h_f32) && aligned16(p.b13) && reinterpret_cast<std::uintptr_t>(p.out_codes) % 8 == 0,
          "gated_activation_fp8: h_f32 and b13 must be 16-byte aligned, out_codes 8-byte aligned");
  require(p.out_scales_ld >= p.capacity,
          "gated_activation_fp8: out_scales_ld must be >= capacity, is " + std::to_string(p.out_scales_ld));
  const dim3 grid(ceil_div(p.capacity, kRowsPerBlock));
  switch (p.activation) {
    case Activation::SwiGLU:
      launch_pdl(gated_activation_fp8_kernel<Activation::SwiGLU>, grid, kThreads, 0, stream, p);
      break;
    case Activation::GeGLU:
      launch_pdl(gated_activation_fp8_kernel<Activation::GeGLU>, grid, kThreads, 0, stream, p);
      break;
    case Activation::SwiGLUOai:
      launch_pdl(gated_activation_fp8_kernel<Activation::SwiGLUOai>, grid, kThreads, 0, stream, p);
      break;
    case Activation::ReLU2:
      launch_pdl(gated_activation_fp8_kernel<Activation::ReLU2>, grid, kThreads, 0, stream, p);
      break;
    default:
      throw std::invalid_argument("gated_activation_fp8: unknown activation " +
                                  std::to_string(static_cast<int>(p.activation)));
  }
  UNIMOE_LAUNCH_CHECK();
}

void launch_gather_fp8_rows(const GatherFp8RowsParams& p, KernelStream stream) {
  require(p.hidden > 0 && p.hidden % 128 == 0,
          "gather_fp8_rows: hidden must be a positive multiple of 128, is " + std::to_string(p.hidden));
  require(p.top_k > 0 && p.num_groups >= 0 && p.capacity >= 0,
          "gather_fp8_rows: top_k must be positive, num_groups and capacity non-negative");
  if (p.capacity == 0) return;
  require(p.codes && p.scales && p.permuted_to_expanded && p.expert_offsets && p.out_codes &&
              p.out_scales,
          "gather_fp8_rows: a null pointer");
  require(aligned16(p.codes) && aligned16(p.out_codes),
          "gather_fp8_rows: codes and out_codes must be 16-byte aligned");
  require(p.scales_ld > 0 && p.out_scales_ld >= p.capacity,
          "gather_fp8_rows: scales_ld must be positive and out_scales_ld >= capacity");
  launch_pdl(gather_fp8_rows_kernel, ceil_div(p.capacity, kRowsPerBlock), kThreads, 0, stream, p);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
