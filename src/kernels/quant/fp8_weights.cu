// Weight quantization to e4m3 (contract: fp8_weights.cuh). The element rule
// is core/e4m3.h's integer encoder after one IEEE division (__fdiv_rn), the
// scale one IEEE division of the amax by 448, so codes and scales are the
// reference's bit for bit. amax folds fmaxf(amax, |x|) from 0: fmaxf returns
// the number when the other operand is NaN, so NaN elements are skipped as
// in the reference, and max is exact, so the order of the reduction does
// not change the result.
//
// Every kernel is templated on a loader that gives 8 consecutive values of
// the whole [E, rows, cols] array from an index that is a multiple of 8:
// cols is a multiple of 16, so 8 values never straddle two rows (nor two
// 128-column tiles, whose edges are multiples of 8 too).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/e4m3.h"
#include "kernels/common/common.cuh"
#include "kernels/quant/fp8_amax.cuh"
#include "kernels/quant/fp8_weights.cuh"
#include "kernels/quant/weight_source.cuh"

namespace unimoe {
namespace {

using fp8_amax::block_max;
using fp8_amax::fp8_scale;
using fp8_amax::kWarpSize;
using fp8_amax::warp_max;
using weight_source::Bf16Loader;
using weight_source::kVec;  // values a thread loads and encodes at once: 16 bytes of bf16, 8 codes
using weight_source::SyntheticLoader;
constexpr int kColsMultiple = 16;
static_assert(kColsMultiple % kVec == 0, "8 values never straddle two rows");
static_assert(kFp8WeightBlock % kVec == 0, "8 values never straddle two tiles");

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;

// Tile form: a CTA covers one 128 x 128 tile in 8 steps of 16 rows, 16
// threads across a row of the tile, 8 columns each.
constexpr int kTileVecCols = kFp8WeightBlock / kVec;           // 16
constexpr int kTileRowsPerStep = kThreads / kTileVecCols;      // 16
constexpr int kTileSteps = kFp8WeightBlock / kTileRowsPerStep;  // 8
static_assert(kThreads % kTileVecCols == 0, "whole tile rows a step");
static_assert(kFp8WeightBlock % kTileRowsPerStep == 0, "whole steps a tile");

// Tensor form: each expert's vectors are split over `chunks` CTAs of grid-
// stride loops, the same split in both kernels.
constexpr int kMaxChunks = 1024;  // per expert; every CTA of the second kernel reads them all

__device__ __forceinline__ float abs_max(float m, const float (&v)[kVec]) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) m = fmaxf(m, fabsf(v[k]));
  return m;
}

// Eight codes of consecutive elements, the first in the lowest byte.
__device__ __forceinline__ uint2 encode8(const float (&v)[kVec], float scale) {
  uint32_t word[2] = {0u, 0u};
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    word[k / 4] |= static_cast<uint32_t>(encode_e4m3(__fdiv_rn(v[k], scale))) << (8 * (k % 4));
  return make_uint2(word[0], word[1]);
}

// FP8Block128. CTA b covers tile b % tiles of expert b / tiles (tiles =
// tile_rows * tile_cols), so scales[b] is the row-major [E, tile_rows,
// tile_cols] entry. The tile is held in registers (8 vectors a thread)
// between its amax and its encode.
template <typename Loader>
__global__ void __launch_bounds__(kThreads)
    quantize_fp8_weight_tiles_kernel(Loader src, int rows, int cols, int tile_rows, int tile_cols,
                                     uint2* __restrict__ codes, float* __restrict__ scales) {
  pdl_begin();
  const int64_t tiles = static_cast<int64_t>(tile_rows) * tile_cols;
  const int64_t expert = blockIdx.x / tiles;
  const int64_t tile = blockIdx.x % tiles;
  const int64_t first_row = (tile / tile_cols) * kFp8WeightBlock + threadIdx.x / kTileVecCols;
  const int64_t col = (tile % tile_cols) * kFp8WeightBlock + (threadIdx.x % kTileVecCols) * kVec;
  // The tile ends where the matrix does (ragged last tiles): a vector is in
  // it when its first column and its row are in the matrix.
  const int64_t expert_row = expert * rows;  // row of [E * rows, cols]
  float v[kTileSteps][kVec];
  float amax = 0.0f;
#pragma unroll
  for (int s = 0; s < kTileSteps; ++s) {
    const int64_t row = first_row + s * kTileRowsPerStep;
    if (col < cols && row < rows) {
      src.load((expert_row + row) * cols + col, v[s]);
      amax = abs_max(amax, v[s]);
    }
  }
  const float scale = fp8_scale(block_max<kWarps>(amax));
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
#pragma unroll
  for (int s = 0; s < kTileSteps; ++s) {
    const int64_t row = first_row + s * kTileRowsPerStep;
    if (col < cols && row < rows) codes[((expert_row + row) * cols + col) / kVec] = encode8(v[s], scale);
  }
}

// FP8PerTensor, first kernel: partials[b] = amax over the vectors of expert
// b / chunks that chunk b % chunks visits (`vecs` vectors an expert).
template <typename Loader>
__global__ void __launch_bounds__(kThreads)
    fp8_weight_amax_kernel(Loader src, int64_t vecs, int chunks, float* __restrict__ partials) {
  pdl_begin();
  const int64_t expert = blockIdx.x / chunks;
  const int64_t chunk = blockIdx.x % chunks;
  const int64_t first = expert * vecs;
  float amax = 0.0f;
  for (int64_t j = chunk * kThreads + threadIdx.x; j < vecs; j += static_cast<int64_t>(chunks) * kThreads) {
    float v[kVec];
    src.load((first + j) * kVec, v);
    amax = abs_max(amax, v);
  }
  amax = block_max<kWarps>(amax);
  if (threadIdx.x == 0) partials[blockIdx.x] = amax;
}

// FP8PerTensor, second kernel: every CTA reduces its expert's partial
// maxima to the scale, the expert's first CTA stores it, then all encode
// the vectors their chunk visits.
template <typename Loader>
__global__ void __launch_bounds__(kThreads)
    quantize_fp8_weight_tensor_kernel(Loader src, int64_t vecs, int chunks,
                                      const float* __restrict__ partials, uint2* __restrict__ codes,
                                      float* __restrict__ scales) {
  pdl_begin();
  const int64_t expert = blockIdx.x / chunks;
  const int64_t chunk = blockIdx.x % chunks;
  float m = 0.0f;
  for (int i = threadIdx.x; i < chunks; i += kThreads) m = fmaxf(m, partials[expert * chunks + i]);
  const float scale = fp8_scale(block_max<kWarps>(m));
  if (chunk == 0 && threadIdx.x == 0) scales[expert] = scale;
  const int64_t first = expert * vecs;
  for (int64_t j = chunk * kThreads + threadIdx.x; j < vecs; j += static_cast<int64_t>(chunks) * kThreads) {
    float v[kVec];
    src.load((first + j) * kVec, v);
    codes[first + j] = encode8(v, scale);
  }
}

void require(bool ok, const std::string& field, const std::string& what) {
  if (!ok) throw std::invalid_argument("quantize_fp8_weights: " + field + " " + what);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_variant(QuantVariant v) {
  require(v == QuantVariant::FP8Block128 || v == QuantVariant::FP8PerTensor, "variant",
          "must be FP8Block128 or FP8PerTensor, is " + to_string(v));
}

void check_shape(int experts, int rows, int cols) {
  require(experts >= 0, "experts", "must be >= 0, is " + std::to_string(experts));
  require(rows >= 0, "rows", "must be >= 0, is " + std::to_string(rows));
  require(cols >= 0 && cols % kColsMultiple == 0, "cols",
          "must be a non-negative multiple of 16, is " + std::to_string(cols));
  const int64_t per_expert = static_cast<int64_t>(rows) * cols;  // < 2^62
  require(experts == 0 || per_expert <= std::numeric_limits<int64_t>::max() / experts, "experts",
          "times rows times cols overflows 64 bits");
}

// CTAs an expert's vectors are split over in the tensor form: one step of
// kThreads vectors each, at least 1 (an empty expert still gets its
// scale) and at most kMaxChunks.
int tensor_chunks(int rows, int cols) {
  const int64_t vecs = static_cast<int64_t>(rows) * cols / kVec;
  return static_cast<int>(std::clamp<int64_t>(ceil_div64(vecs, kThreads), 1, kMaxChunks));
}

// A 1-D grid of `blocks` CTAs (blocks > 0), or the error naming the limit.
dim3 grid_of(int64_t blocks) {
  require(blocks <= std::numeric_limits<int32_t>::max(), "experts",
          "and the matrix size need " + std::to_string(blocks) + " CTAs, over the grid's 2^31 - 1");
  return dim3(static_cast<unsigned>(blocks));
}

template <typename Loader>
void launch_with(const Fp8WeightQuantParams& p, const Loader& src, KernelStream stream) {
  auto* codes = reinterpret_cast<uint2*>(p.codes);
  if (p.variant == QuantVariant::FP8Block128) {
    const int tile_rows = static_cast<int>(ceil_div64(p.rows, kFp8WeightBlock));
    const int tile_cols = static_cast<int>(ceil_div64(p.cols, kFp8WeightBlock));
    const int64_t blocks = static_cast<int64_t>(p.experts) * tile_rows * tile_cols;
    if (blocks == 0) return;  // rows or cols 0: no tile, no scale
    launch_pdl(quantize_fp8_weight_tiles_kernel<Loader>, grid_of(blocks), kThreads, 0, stream, src,
               p.rows, p.cols, tile_rows, tile_cols, codes, p.scales);
    UNIMOE_LAUNCH_CHECK();
    return;
  }
  const int chunks = tensor_chunks(p.rows, p.cols);
  const dim3 grid = grid_of(static_cast<int64_t>(p.experts) * chunks);
  const int64_t vecs = static_cast<int64_t>(p.rows) * p.cols / kVec;
  launch_pdl(fp8_weight_amax_kernel<Loader>, grid, kThreads, 0, stream, src, vecs, chunks, p.scratch);
  UNIMOE_LAUNCH_CHECK();
  launch_pdl(quantize_fp8_weight_tensor_kernel<Loader>, grid, kThreads, 0, stream, src, vecs, chunks,
             static_cast<const float*>(p.scratch), codes, p.scales);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace

std::size_t fp8_weight_scale_count(QuantVariant variant, int experts, int rows, int cols) {
  check_variant(variant);
  check_shape(experts, rows, cols);
  if (variant == QuantVariant::FP8PerTensor) return static_cast<std::size_t>(experts);
  return static_cast<std::size_t>(experts) * ceil_div64(rows, kFp8WeightBlock) *
         ceil_div64(cols, kFp8WeightBlock);
}

std::size_t quantize_fp8_weights_scratch_floats(QuantVariant variant, int experts, int rows, int cols) {
  check_variant(variant);
  check_shape(experts, rows, cols);
  if (variant == QuantVariant::FP8Block128) return 0;
  return static_cast<std::size_t>(experts) * tensor_chunks(rows, cols);
}

void launch_quantize_fp8_weights(const Fp8WeightQuantParams& p, KernelStream stream) {
  check_variant(p.variant);
  check_shape(p.experts, p.rows, p.cols);
  const WeightSource& s = p.source;
  require(s.kind == WeightSourceKind::Bf16 || s.kind == WeightSourceKind::Synthetic, "source",
          "kind is not a WeightSourceKind");
  if (p.experts == 0) return;
  require(p.scales != nullptr || fp8_weight_scale_count(p.variant, p.experts, p.rows, p.cols) == 0,
          "scales", "is null");
  require(p.variant != QuantVariant::FP8PerTensor || p.scratch != nullptr, "scratch",
          "is null (FP8PerTensor needs quantize_fp8_weights_scratch_floats floats)");
  if (static_cast<int64_t>(p.rows) * p.cols > 0) {
    require(p.codes != nullptr && aligned16(p.codes), "codes", "must be a 16-byte aligned device pointer");
    require(s.kind != WeightSourceKind::Bf16 || (s.bf16 != nullptr && aligned16(s.bf16)), "source",
            "bf16 must be a 16-byte aligned device pointer");
  }
  if (s.kind == WeightSourceKind::Bf16)
    launch_with(p, Bf16Loader{reinterpret_cast<const uint4*>(s.bf16)}, stream);
  else
    launch_with(p, SyntheticLoader{s.seed, s.scale}, stream);
}

}  // namespace unimoe
