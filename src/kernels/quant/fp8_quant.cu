// bf16 -> e4m3 activation quantization (contract: fp8_quant.cuh). The
// element rule is core/e4m3.h's integer encoder after one IEEE division
// (__fdiv_rn), so the codes are the reference's bit for bit. amax folds
// fmaxf(amax, |x|) from 0: fmaxf returns the number when the other operand
// is NaN, so NaN elements are skipped as in the reference, and max is exact,
// so the order of the reduction does not change the result.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/e4m3.h"
#include "kernels/common/common.cuh"
#include "kernels/quant/fp8_amax.cuh"
#include "kernels/quant/fp8_encode.cuh"
#include "kernels/quant/fp8_quant.cuh"

namespace unimoe {
namespace {

using fp8_amax::block_max;
using fp8_amax::fp8_scale;
using fp8_amax::kWarpSize;
using fp8_amax::warp_max;
using fp8_encode::abs_max4;
using fp8_encode::encode4;
using fp8_encode::Four;
using fp8_encode::load4;
constexpr int kColsMultiple = 16;

// Row form: one warp per (row, group), 4 bf16 (8 bytes) a lane.
constexpr int kRowWarps = 8;
constexpr int kRowThreads = kRowWarps * kWarpSize;
constexpr int kRowVec = fp8_encode::kVec;
static_assert(kFp8GroupCols == fp8_encode::kGroupCols, "a warp covers one 128-column group");
static_assert(kColsMultiple % kRowVec == 0, "a lane's 4 columns never straddle the end of a row");

// Tensor form: 8 bf16 (16 bytes) a thread and step, grid-stride loops.
constexpr int kTensorThreads = 256;
constexpr int kTensorWarps = kTensorThreads / kWarpSize;
constexpr int kTensorVec = 8;
constexpr int kMaxAmaxBlocks = 1024;   // partial maxima, each quantize block reads them all
constexpr int kMaxQuantBlocks = 4096;
static_assert(kColsMultiple % kTensorVec == 0, "a thread's 8 columns never straddle rows");

__device__ __forceinline__ int live_rows(const int32_t* rows_device, int rows) {
  return rows_device ? min(*rows_device, rows) : rows;
}

// Where the scale of (row, group) goes: row-major [rows, groups] when ld is
// 0, else group-major scales[group * ld + row] (the FP8 GEMMs' layout).
__device__ __forceinline__ int64_t scale_index(int row, int group, int groups, int ld) {
  return ld == 0 ? static_cast<int64_t>(row) * groups + group
                 : static_cast<int64_t>(group) * ld + row;
}

template <typename In>
__global__ void __launch_bounds__(kRowThreads)
    quantize_fp8_rows_kernel(const In* __restrict__ x, int rows, int cols, int groups,
                             const int32_t* __restrict__ rows_device, uint32_t* __restrict__ codes,
                             float* __restrict__ scales, int scales_ld, bool early) {
  pdl_begin();
  if (early) pdl_launch_dependents();
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarpSize;
  const int row = static_cast<int>(task / groups);
  const int group = static_cast<int>(task % groups);
  if (row >= live_rows(rows_device, rows)) return;  // the whole warp leaves
  const int lane = threadIdx.x % kWarpSize;
  const int col = group * kFp8GroupCols + lane * kRowVec;
  const bool in_row = col < cols;  // the last group may be ragged (a multiple of 16 wide)
  const int64_t vec = (static_cast<int64_t>(row) * cols + col) / kRowVec;
  const Four f = in_row ? load4(x, vec) : Four{};
  const float scale = fp8_scale(warp_max(abs_max4(0.0f, f)));
  if (lane == 0) scales[scale_index(row, group, groups, scales_ld)] = scale;
  if (in_row) codes[vec] = encode4(f, scale);
}

// The row kernel's (row, group) warp, its codes and scale written to each
// permuted row of the token instead (4 bytes a lane: 128 contiguous bytes
// a warp and destination).
__global__ void __launch_bounds__(kRowThreads)
    quantize_fp8_rows_scatter_kernel(const uint16_t* __restrict__ x, int rows, int cols,
                                     int groups, const int32_t* __restrict__ expanded_to_permuted,
                                     int top_k, const float* __restrict__ static_scale,
                                     uint32_t* __restrict__ codes,
                                     float* __restrict__ scales, int scales_ld) {
  pdl_begin();
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarpSize;
  const int row = static_cast<int>(task / groups);
  const int group = static_cast<int>(task % groups);
  if (row >= rows) return;  // the whole warp leaves
  const int lane = threadIdx.x % kWarpSize;
  const int col = group * kFp8GroupCols + lane * kRowVec;
  const Four f = load4(x, (static_cast<int64_t>(row) * cols + col) / kRowVec);
  const float scale = static_scale ? *static_scale : fp8_scale(warp_max(abs_max4(0.0f, f)));
  const uint32_t packed = encode4(f, scale);
  for (int k = 0; k < top_k; ++k) {
    const int dst = expanded_to_permuted[static_cast<int64_t>(row) * top_k + k];
    if (dst < 0) continue;  // warp-uniform
    codes[(static_cast<int64_t>(dst) * cols + col) / kRowVec] = packed;
    if (lane == 0) scales[static_cast<int64_t>(group) * scales_ld + dst] = scale;
  }
}

// Partial maxima: partials[b] = amax over the live elements block b visits.
// A thread takes 8 values a step: two Fours.
template <typename In>
__global__ void __launch_bounds__(kTensorThreads)
    fp8_tensor_amax_kernel(const In* __restrict__ x, int rows, int cols,
                           const int32_t* __restrict__ rows_device, float* __restrict__ partials) {
  pdl_begin();
  const int64_t vecs = static_cast<int64_t>(live_rows(rows_device, rows)) * (cols / kTensorVec);
  float m = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kTensorThreads + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * kTensorThreads)
    m = abs_max4(abs_max4(m, load4(x, 2 * i)), load4(x, 2 * i + 1));
  m = block_max<kTensorWarps>(m);
  if (threadIdx.x == 0) partials[blockIdx.x] = m;
}

// One block: the scale of the largest of the partial maxima.
__global__ void __launch_bounds__(kTensorThreads)
    fp8_scale_from_partials_kernel(const float* __restrict__ partials, int num_partials,
                                   float* __restrict__ scale) {
  pdl_begin();
  float m = 0.0f;
  for (int i = threadIdx.x; i < num_partials; i += kTensorThreads) m = fmaxf(m, partials[i]);
  m = block_max<kTensorWarps>(m);
  if (threadIdx.x == 0) *scale = fp8_scale(m);
}

// Small calls with a dynamic scale (decode: x of one token, the activation
// of a few rows): one block of kSmallThreads loads every live element into
// registers at once (kSmallVecs Fours a thread, all loads in flight
// together), reduces the amax, and encodes from the same registers: one
// memory round trip and one kernel, where the two-kernel form below makes
// one of each per pass.
constexpr int kSmallThreads = 1024;
constexpr int kSmallVecs = 8;
constexpr int64_t kSmallElements = static_cast<int64_t>(kSmallThreads) * kSmallVecs * kRowVec;

template <typename In>
__global__ void __launch_bounds__(kSmallThreads)
    quantize_fp8_tensor_small_kernel(const In* __restrict__ x, int rows, int cols,
                                     const int32_t* __restrict__ rows_device,
                                     uint32_t* __restrict__ codes, float* __restrict__ scale_out,
                                     float* __restrict__ row_scales, int row_scales_ld,
                                     bool early) {
  pdl_begin();
  if (early) pdl_launch_dependents();
  const int live = live_rows(rows_device, rows);
  const int64_t fours = static_cast<int64_t>(live) * (cols / kRowVec);
  Four f[kSmallVecs];
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < kSmallVecs; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kSmallThreads;
    f[j] = i < fours ? load4(x, i) : Four{};
    m = abs_max4(m, f[j]);
  }
  const float scale = fp8_scale(block_max<kSmallThreads / kWarpSize>(m));
  if (threadIdx.x == 0) *scale_out = scale;
#pragma unroll
  for (int j = 0; j < kSmallVecs; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kSmallThreads;
    if (i < fours) codes[i] = encode4(f[j], scale);
  }
  if (row_scales) {
    const int groups = (cols + kFp8GroupCols - 1) / kFp8GroupCols;
    for (int i = threadIdx.x; i < live * groups; i += kSmallThreads)
      row_scales[(i % groups) * row_scales_ld + i / groups] = scale;
  }
}

// Every block reduces the partial maxima to the one scale (or reads the
// static scale), block 0 stores it, then all quantize the live elements and,
// when asked, broadcast the scale to every (live row, group) of row_scales.
template <typename In>
__global__ void __launch_bounds__(kTensorThreads)
    quantize_fp8_tensor_kernel(const In* __restrict__ x, int rows, int cols,
                               const int32_t* __restrict__ rows_device,
                               const float* __restrict__ static_scale,
                               const float* __restrict__ partials, int num_partials,
                               uint2* __restrict__ codes, float* __restrict__ scale_out,
                               float* __restrict__ row_scales, int row_scales_ld, bool early) {
  pdl_begin();
  if (early) pdl_launch_dependents();
  const int live = live_rows(rows_device, rows);
  const int64_t vecs = static_cast<int64_t>(live) * (cols / kTensorVec);
  float scale;
  if (static_scale) {
    scale = *static_scale;
  } else {
    float m = 0.0f;
    for (int i = threadIdx.x; i < num_partials; i += kTensorThreads) m = fmaxf(m, partials[i]);
    scale = fp8_scale(block_max<kTensorWarps>(m));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_out = scale;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kTensorThreads + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * kTensorThreads)
    codes[i] = make_uint2(encode4(load4(x, 2 * i), scale), encode4(load4(x, 2 * i + 1), scale));
  if (row_scales) {
    const int groups = (cols + kFp8GroupCols - 1) / kFp8GroupCols;
    const int64_t n = static_cast<int64_t>(live) * groups;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kTensorThreads + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * kTensorThreads)
      row_scales[(i % groups) * row_scales_ld + i / groups] = scale;
  }
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

void check_shape(const char* name, int rows, int cols) {
  require(rows >= 0, std::string(name) + ": rows must be >= 0, is " + std::to_string(rows));
  require(cols > 0 && cols % kColsMultiple == 0,
          std::string(name) + ": cols must be a positive multiple of 16, is " + std::to_string(cols));
}

// Blocks of kTensorThreads for one 8-value step per thread, at least 1 and
// at most `cap` (the loops stride over the rest).
int tensor_blocks(int rows, int cols, int cap) {
  const int64_t vecs = static_cast<int64_t>(rows) * (cols / kTensorVec);
  return static_cast<int>(std::clamp<int64_t>((vecs + kTensorThreads - 1) / kTensorThreads, 1, cap));
}

}  // namespace

// Exactly one of the bf16 and fp32 inputs.
void check_input(const char* name, const void* bf16, const void* f32, int rows) {
  require(rows == 0 || (bf16 != nullptr) != (f32 != nullptr),
          std::string(name) + ": give exactly one of x (bf16) and x_f32");
}

void launch_quantize_fp8_rows(const Fp8RowQuantParams& p, KernelStream stream) {
  check_shape("quantize_fp8_rows", p.rows, p.cols);
  if (p.rows == 0) return;
  check_input("quantize_fp8_rows", p.x, p.x_f32, p.rows);
  require(p.codes && p.scales, "quantize_fp8_rows: a null pointer");
  require(aligned16(p.x) && aligned16(p.x_f32) && aligned16(p.codes),
          "quantize_fp8_rows: x, x_f32 and codes must be 16-byte aligned");
  require(p.scales_ld == 0 || p.scales_ld >= p.rows,
          "quantize_fp8_rows: scales_ld must be 0 (row-major) or >= rows, is " +
              std::to_string(p.scales_ld));
  const int groups = ceil_div(p.cols, kFp8GroupCols);
  const int64_t blocks = (static_cast<int64_t>(p.rows) * groups + kRowWarps - 1) / kRowWarps;
  require(blocks <= 0x7fffffff, "quantize_fp8_rows: too many rows");
  const dim3 grid(static_cast<unsigned>(blocks));
  auto* codes = reinterpret_cast<uint32_t*>(p.codes);
  const bool early = p.early_dependents && blocks <= kFp8QuantEarlyMaxCtas;
  if (p.x)
    launch_pdl(quantize_fp8_rows_kernel<uint16_t>, grid, kRowThreads, 0, stream, p.x, p.rows,
               p.cols, groups, p.rows_device, codes, p.scales, p.scales_ld, early);
  else
    launch_pdl(quantize_fp8_rows_kernel<float>, grid, kRowThreads, 0, stream, p.x_f32, p.rows,
               p.cols, groups, p.rows_device, codes, p.scales, p.scales_ld, early);
  UNIMOE_LAUNCH_CHECK();
}

void launch_quantize_fp8_rows_scatter(const Fp8RowScatterParams& p, KernelStream stream) {
  require(p.rows >= 0, "quantize_fp8_rows_scatter: rows must be >= 0, is " + std::to_string(p.rows));
  require(p.cols > 0 && p.cols % kFp8GroupCols == 0,
          "quantize_fp8_rows_scatter: cols must be a positive multiple of 128, is " +
              std::to_string(p.cols));
  if (p.rows == 0) return;
  require(p.top_k > 0 && p.capacity >= static_cast<int64_t>(p.rows) * p.top_k,
          "quantize_fp8_rows_scatter: top_k must be positive and capacity >= rows * top_k");
  require(p.x && p.expanded_to_permuted && p.codes && p.scales,
          "quantize_fp8_rows_scatter: a null pointer");
  require(aligned16(p.x) && aligned16(p.codes),
          "quantize_fp8_rows_scatter: x and codes must be 16-byte aligned");
  require(p.scales_ld >= p.capacity,
          "quantize_fp8_rows_scatter: scales_ld must be >= capacity, is " + std::to_string(p.scales_ld));
  const int groups = p.cols / kFp8GroupCols;
  const int64_t blocks = (static_cast<int64_t>(p.rows) * groups + kRowWarps - 1) / kRowWarps;
  require(blocks <= 0x7fffffff, "quantize_fp8_rows_scatter: too many rows");
  launch_pdl(quantize_fp8_rows_scatter_kernel, dim3(static_cast<unsigned>(blocks)), kRowThreads, 0,
             stream, p.x, p.rows, p.cols, groups, p.expanded_to_permuted, p.top_k, p.static_scale,
             reinterpret_cast<uint32_t*>(p.codes), p.scales, p.scales_ld);
  UNIMOE_LAUNCH_CHECK();
}

std::size_t quantize_fp8_tensor_scratch_floats(int rows, int cols) {
  check_shape("quantize_fp8_tensor", rows, cols);
  return static_cast<std::size_t>(tensor_blocks(rows, cols, kMaxAmaxBlocks));
}

namespace {

// Calls of at most kSmallElements (32768) elements with a dynamic scale
// run as the one-block register kernel (at T = 1 of H = 7168, 7 values a
// thread), larger ones as the two kernels.
template <typename In>
void launch_tensor(const Fp8TensorQuantParams& p, const In* x, KernelStream stream) {
  int num_partials = 0;
  const bool small = !p.static_scale && static_cast<int64_t>(p.rows) * p.cols <= kSmallElements;
  if (small) {
    launch_pdl(quantize_fp8_tensor_small_kernel<In>, dim3(1), kSmallThreads, 0, stream, x, p.rows,
               p.cols, p.rows_device, reinterpret_cast<uint32_t*>(p.codes), p.scale, p.row_scales,
               p.row_scales_ld, p.early_dependents);
    UNIMOE_LAUNCH_CHECK();
    return;
  }
  if (!p.static_scale) {
    require(p.scratch != nullptr, "quantize_fp8_tensor: a dynamic scale needs scratch");
    num_partials = tensor_blocks(p.rows, p.cols, kMaxAmaxBlocks);
    launch_pdl(fp8_tensor_amax_kernel<In>, dim3(num_partials), kTensorThreads, 0, stream, x,
               p.rows, p.cols, p.rows_device, p.scratch);
    UNIMOE_LAUNCH_CHECK();
  }
  const int blocks = tensor_blocks(p.rows, p.cols, kMaxQuantBlocks);
  launch_pdl(quantize_fp8_tensor_kernel<In>, dim3(blocks), kTensorThreads, 0, stream, x, p.rows,
             p.cols, p.rows_device, p.static_scale, static_cast<const float*>(p.scratch),
             num_partials, reinterpret_cast<uint2*>(p.codes), p.scale, p.row_scales,
             p.row_scales_ld, p.early_dependents && blocks <= kFp8QuantEarlyMaxCtas);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace

void launch_fp8_scale_from_partials(const float* partials, int num_partials, float* scale,
                                    KernelStream stream) {
  require(partials && scale, "fp8_scale_from_partials: a null pointer");
  require(num_partials >= 1, "fp8_scale_from_partials: num_partials must be >= 1, is " +
                                 std::to_string(num_partials));
  launch_pdl(fp8_scale_from_partials_kernel, dim3(1), kTensorThreads, 0, stream, partials,
             num_partials, scale);
  UNIMOE_LAUNCH_CHECK();
}

void launch_fp8_tensor_scale(const Fp8TensorQuantParams& p, KernelStream stream) {
  check_shape("fp8_tensor_scale", p.rows, p.cols);
  require(p.scale && p.scratch, "fp8_tensor_scale: scale and scratch must be given");
  check_input("fp8_tensor_scale", p.x, p.x_f32, p.rows);
  require(aligned16(p.x) && aligned16(p.x_f32), "fp8_tensor_scale: x and x_f32 must be 16-byte aligned");
  // A capacity of 0 still writes the scale (1), as the dynamic form does.
  const int num_partials = tensor_blocks(p.rows, p.cols, kMaxAmaxBlocks);
  if (p.x_f32)
    launch_pdl(fp8_tensor_amax_kernel<float>, dim3(num_partials), kTensorThreads, 0, stream,
               p.x_f32, p.rows, p.cols, p.rows_device, p.scratch);
  else
    launch_pdl(fp8_tensor_amax_kernel<uint16_t>, dim3(num_partials), kTensorThreads, 0, stream,
               p.x, p.rows, p.cols, p.rows_device, p.scratch);
  UNIMOE_LAUNCH_CHECK();
  launch_fp8_scale_from_partials(p.scratch, num_partials, p.scale, stream);
}

void launch_quantize_fp8_tensor(const Fp8TensorQuantParams& p, KernelStream stream) {
  check_shape("quantize_fp8_tensor", p.rows, p.cols);
  require(p.scale != nullptr, "quantize_fp8_tensor: scale is null");
  check_input("quantize_fp8_tensor", p.x, p.x_f32, p.rows);
  require(p.rows == 0 || p.codes, "quantize_fp8_tensor: codes is null");
  require(aligned16(p.x) && aligned16(p.x_f32) && aligned16(p.codes),
          "quantize_fp8_tensor: x, x_f32 and codes must be 16-byte aligned");
  require(!p.row_scales || p.row_scales_ld >= p.rows,
          "quantize_fp8_tensor: row_scales_ld must be >= rows, is " + std::to_string(p.row_scales_ld));
  if (p.x_f32)
    launch_tensor(p, p.x_f32, stream);
  else
    launch_tensor(p, p.x, stream);
}

}  // namespace unimoe
