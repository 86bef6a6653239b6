// 4-bit weight quantization and preparation (contract: fp4_weights.cuh).
//
// Quantization: one thread per block of 32 (MXFP4) or 16 (NVFP4) values,
// which it loads (4 or 2 loads of 8), reduces to the block amax, encodes
// with core/e2m1.h and stores as one 16- or 8-byte vector of codes and one
// scale byte. cols is a multiple of the block, so a block never straddles
// two rows and block b of the whole [E, rows, cols] array covers values
// [b * block, (b + 1) * block): codes bytes [b * block / 2, ...), scale
// byte b. amax folds fmaxf(amax, |x|) from 0, which skips NaN as the
// reference does and is exact, so the order of a reduction does not change
// its result.
//
// Preparation: one thread per 32 values of a destination row (16 code
// bytes, one uint4 of four 32-bit words).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/e2m1.h"
#include "core/fp4_layout.h"
#include "kernels/common/common.cuh"
#include "kernels/quant/fp4_weights.cuh"
#include "kernels/quant/fp8_amax.cuh"
#include "kernels/quant/weight_source.cuh"

namespace unimoe {
namespace {

using fp8_amax::block_max;
using fp8_amax::kWarpSize;
using weight_source::Bf16Loader;
using weight_source::kVec;
using weight_source::SyntheticLoader;

constexpr int kMxBlock = 32;
constexpr int kNvBlock = 16;
constexpr int kValuesPerWord = 8;  // e2m1 nibbles in a 32-bit word
static_assert(kVec == kValuesPerWord, "one load of values encodes to one word of codes");
static_assert(kNvBlock % kVec == 0 && kMxBlock % kVec == 0, "whole loads a block");

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
// Each expert's blocks are split over `chunks` CTAs of grid-stride loops,
// the same split in both NVFP4 kernels.
constexpr int kMaxChunks = 1024;  // per expert; every CTA of the second kernel reads them all

constexpr int kPrepareValues = 32;  // values a prepare thread moves: 16 bytes of codes
constexpr int kPrepareMaxCtas = 1 << 16;

template <typename Loader>
__device__ __forceinline__ float load_amax(const Loader& src, int64_t first, float (&v)[kVec]) {
  src.load(first, v);
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) m = fmaxf(m, fabsf(v[k]));
  return m;
}

// NVFP4, first kernel: partials[c] = amax over the 8-value vectors of expert
// c / chunks that chunk c % chunks visits (`vecs` vectors an expert).
template <typename Loader>
__global__ void __launch_bounds__(kThreads)
    fp4_weight_amax_kernel(Loader src, int64_t vecs, int chunks, float* __restrict__ partials) {
  pdl_begin();
  const int64_t expert = blockIdx.x / chunks;
  const int64_t chunk = blockIdx.x % chunks;
  const int64_t first = expert * vecs;
  float amax = 0.0f;
  for (int64_t j = chunk * kThreads + threadIdx.x; j < vecs; j += static_cast<int64_t>(chunks) * kThreads) {
    float v[kVec];
    amax = fmaxf(amax, load_amax(src, (first + j) * kVec, v));
  }
  amax = block_max<kWarps>(amax);
  if (threadIdx.x == 0) partials[blockIdx.x] = amax;
}

// Both variants (kBlock 32: MXFP4; 16: NVFP4, whose CTAs first reduce their
// expert's partial maxima to its global scale, stored by the expert's first
// CTA). `blocks` blocks an expert; CTA c covers expert c / chunks.
template <typename Loader, int kBlock>
__global__ void __launch_bounds__(kThreads)
    quantize_fp4_weights_kernel(Loader src, int64_t blocks, int chunks, const float* __restrict__ partials,
                                uint8_t* __restrict__ codes, uint8_t* __restrict__ block_scales,
                                float* __restrict__ global_scales) {
  constexpr bool kNv = kBlock == kNvBlock;
  constexpr int kLoads = kBlock / kVec;  // also the 32-bit words of codes a block
  static_assert(kLoads == 4 || kLoads == 2, "one 16- or 8-byte store of codes a block");
  pdl_begin();
  const int64_t expert = blockIdx.x / chunks;
  const int64_t chunk = blockIdx.x % chunks;
  float global = 1.0f;
  if constexpr (kNv) {
    float m = 0.0f;
    for (int i = threadIdx.x; i < chunks; i += kThreads) m = fmaxf(m, partials[expert * chunks + i]);
    global = nvfp4_global_scale(block_max<kWarps>(m));
    if (chunk == 0 && threadIdx.x == 0) global_scales[expert] = global;
  }
  const int64_t first = expert * blocks;
  for (int64_t j = chunk * kThreads + threadIdx.x; j < blocks; j += static_cast<int64_t>(chunks) * kThreads) {
    const int64_t b = first + j;
    float v[kLoads][kVec];
    float amax = 0.0f;
#pragma unroll
    for (int l = 0; l < kLoads; ++l) amax = fmaxf(amax, load_amax(src, b * kBlock + l * kVec, v[l]));
    uint8_t code;
    float divisor = 0.0f;
    if constexpr (kNv) {
      code = nvfp4_block_code(amax, global);
      divisor = nvfp4_divisor(code, global);
    } else {
      code = mx_scale_code(amax);
    }
    uint32_t word[kLoads];
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      word[l] = 0u;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const uint8_t nibble = kNv ? nv_encode(v[l][k], divisor) : mx_encode(v[l][k], code);
        word[l] |= static_cast<uint32_t>(nibble) << (4 * k);
      }
    }
    if constexpr (kLoads == 4)
      reinterpret_cast<uint4*>(codes)[b] = make_uint4(word[0], word[1], word[2], word[3]);
    else
      reinterpret_cast<uint2*>(codes)[b] = make_uint2(word[0], word[1]);
    block_scales[b] = code;
  }
}

// Thread t of the grid-stride loop moves the 32 values q = t % row_chunks
// of destination row t / row_chunks (of all E * rows rows).
__global__ void __launch_bounds__(kThreads) prepare_fp4_weights_kernel(Fp4PrepareParams p) {
  pdl_begin();
  const int64_t row_chunks = p.cols / kPrepareValues;
  const int64_t scales_per_row = p.cols / p.block;
  const int64_t dst_stride = p.dst_scale_stride != 0 ? p.dst_scale_stride : scales_per_row;
  const int scales_per_chunk = kPrepareValues / p.block;  // 1 or 2
  const int64_t total = static_cast<int64_t>(p.experts) * p.rows * row_chunks;
  const int half = p.rows / 2;
  const auto* src = reinterpret_cast<const uint4*>(p.src_codes);
  auto* dst = reinterpret_cast<uint4*>(p.dst_codes);
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t q = t % row_chunks;
    const int64_t row = t / row_chunks;  // e * rows + r
    const int r = static_cast<int>(row % p.rows);
    const int src_r = !p.interleaved ? r : r < half ? 2 * r : 2 * (r - half) + 1;
    const int64_t src_row = row - r + src_r;
    const uint4 w = __ldg(src + src_row * row_chunks + q);
    dst[t] = make_uint4(fp4_prepare_word(w.x), fp4_prepare_word(w.y), fp4_prepare_word(w.z),
                        fp4_prepare_word(w.w));
    for (int s = 0; s < scales_per_chunk; ++s)
      p.dst_scales[row * dst_stride + q * scales_per_chunk + s] =
          p.src_scales[src_row * scales_per_row + q * scales_per_chunk + s];
    if (q == 0 && p.dst_bias != nullptr) p.dst_bias[row] = p.src_bias[src_row];
  }
}

// ---- host side ----------------------------------------------------------------

void require(bool ok, const char* what, const std::string& field, const std::string& why) {
  if (!ok) throw std::invalid_argument(std::string(what) + ": " + field + " " + why);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr const char* kQuantize = "quantize_fp4_weights";
constexpr const char* kPrepare = "prepare_fp4_weights";

void check_shape(const char* what, int experts, int rows, int cols, int multiple) {
  require(experts >= 0, what, "experts", "must be >= 0, is " + std::to_string(experts));
  require(rows >= 0, what, "rows", "must be >= 0, is " + std::to_string(rows));
  require(cols >= 0 && cols % multiple == 0, what, "cols",
          "must be a non-negative multiple of " + std::to_string(multiple) + ", is " + std::to_string(cols));
  const int64_t per_expert = static_cast<int64_t>(rows) * cols;  // < 2^62
  require(experts == 0 || per_expert <= std::numeric_limits<int64_t>::max() / experts, what, "experts",
          "times rows times cols overflows 64 bits");
}

// CTAs an expert's blocks are split over: one step of kThreads blocks
// each, at least 1 (an empty NVFP4 expert still gets its global scale) and
// at most kMaxChunks.
int expert_chunks(int rows, int cols, int block) {
  const int64_t blocks = static_cast<int64_t>(rows) * cols / block;
  return static_cast<int>(std::clamp<int64_t>(ceil_div64(blocks, kThreads), 1, kMaxChunks));
}

dim3 grid_of(const char* what, int64_t blocks) {
  require(blocks <= std::numeric_limits<int32_t>::max(), what, "experts",
          "and the matrix size need " + std::to_string(blocks) + " CTAs, over the grid's 2^31 - 1");
  return dim3(static_cast<unsigned>(blocks));
}

template <typename Loader>
void launch_with(const Fp4WeightQuantParams& p, const Loader& src, KernelStream stream) {
  const int block = fp4_block_size(p.variant);
  const int64_t blocks = static_cast<int64_t>(p.rows) * p.cols / block;
  const int chunks = expert_chunks(p.rows, p.cols, block);
  const dim3 grid = grid_of(kQuantize, static_cast<int64_t>(p.experts) * chunks);
  if (p.variant == QuantVariant::MXFP4) {
    if (blocks == 0) return;  // no block, no scale
    launch_pdl(quantize_fp4_weights_kernel<Loader, kMxBlock>, grid, kThreads, 0, stream, src, blocks, chunks,
               static_cast<const float*>(nullptr), p.codes, p.block_scales, static_cast<float*>(nullptr));
    UNIMOE_LAUNCH_CHECK();
    return;
  }
  const int64_t vecs = static_cast<int64_t>(p.rows) * p.cols / kVec;
  launch_pdl(fp4_weight_amax_kernel<Loader>, grid, kThreads, 0, stream, src, vecs, chunks, p.scratch);
  UNIMOE_LAUNCH_CHECK();
  launch_pdl(quantize_fp4_weights_kernel<Loader, kNvBlock>, grid, kThreads, 0, stream, src, blocks, chunks,
             static_cast<const float*>(p.scratch), p.codes, p.block_scales, p.global_scales);
  UNIMOE_LAUNCH_CHECK();
}

bool overlap(const void* a, const void* b, std::size_t bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

}  // namespace

int fp4_block_size(QuantVariant variant) {
  require(variant == QuantVariant::MXFP4 || variant == QuantVariant::NVFP4, kQuantize, "variant",
          "must be MXFP4 or NVFP4, is " + to_string(variant));
  return variant == QuantVariant::MXFP4 ? kMxBlock : kNvBlock;
}

std::size_t quantize_fp4_weights_scratch_floats(QuantVariant variant, int experts, int rows, int cols) {
  const int block = fp4_block_size(variant);
  check_shape(kQuantize, experts, rows, cols, block);
  if (variant == QuantVariant::MXFP4) return 0;
  return static_cast<std::size_t>(experts) * expert_chunks(rows, cols, block);
}

void launch_quantize_fp4_weights(const Fp4WeightQuantParams& p, KernelStream stream) {
  const int block = fp4_block_size(p.variant);
  check_shape(kQuantize, p.experts, p.rows, p.cols, block);
  const WeightSource& s = p.source;
  require(s.kind == WeightSourceKind::Bf16 || s.kind == WeightSourceKind::Synthetic, kQuantize, "source",
          "kind is not a WeightSourceKind");
  if (p.experts == 0) return;
  const bool nv = p.variant == QuantVariant::NVFP4;
  require(!nv || p.global_scales != nullptr, kQuantize, "global_scales", "is null (NVFP4 needs E floats)");
  require(!nv || p.scratch != nullptr, kQuantize, "scratch",
          "is null (NVFP4 needs quantize_fp4_weights_scratch_floats floats)");
  if (static_cast<int64_t>(p.rows) * p.cols > 0) {
    require(p.codes != nullptr && aligned16(p.codes), kQuantize, "codes",
            "must be a 16-byte aligned device pointer");
    require(p.block_scales != nullptr, kQuantize, "block_scales", "is null");
    require(s.kind != WeightSourceKind::Bf16 || (s.bf16 != nullptr && aligned16(s.bf16)), kQuantize, "source",
            "bf16 must be a 16-byte aligned device pointer");
  }
  if (s.kind == WeightSourceKind::Bf16)
    launch_with(p, Bf16Loader{reinterpret_cast<const uint4*>(s.bf16)}, stream);
  else
    launch_with(p, SyntheticLoader{s.seed, s.scale}, stream);
}

void launch_prepare_fp4_weights(const Fp4PrepareParams& p, KernelStream stream) {
  require(p.block == kMxBlock || p.block == kNvBlock, kPrepare, "block",
          "must be 32 (MXFP4) or 16 (NVFP4), is " + std::to_string(p.block));
  check_shape(kPrepare, p.experts, p.rows, p.cols, kPrepareValues);
  require(p.cols > 0, kPrepare, "cols", "must be positive");
  require(!p.interleaved || p.rows % 2 == 0, kPrepare, "interleaved",
          "needs an even row count (gate and up rows in pairs), rows is " + std::to_string(p.rows));
  require(p.dst_bias == nullptr || p.src_bias != nullptr, kPrepare, "dst_bias", "is set but src_bias is null");
  require(p.src_bias == nullptr || p.dst_bias != nullptr, kPrepare, "dst_bias", "is null but src_bias is set");
  const int64_t rows = static_cast<int64_t>(p.experts) * p.rows;
  if (rows == 0) return;
  const std::size_t code_bytes = static_cast<std::size_t>(rows) * p.cols / 2;
  require(p.src_codes != nullptr && aligned16(p.src_codes), kPrepare, "src_codes",
          "must be a 16-byte aligned device pointer");
  require(p.dst_codes != nullptr && aligned16(p.dst_codes), kPrepare, "dst_codes",
          "must be a 16-byte aligned device pointer");
  require(!overlap(p.src_codes, p.dst_codes, code_bytes), kPrepare, "dst_codes", "overlaps src_codes");
  require(p.src_scales != nullptr, kPrepare, "src_scales", "is null");
  require(p.dst_scales != nullptr, kPrepare, "dst_scales", "is null");
  require(p.dst_scale_stride == 0 || p.dst_scale_stride >= p.cols / p.block, kPrepare,
          "dst_scale_stride",
          "is " + std::to_string(p.dst_scale_stride) + "; must be 0 or at least cols / block");
  const int64_t threads = rows * (p.cols / kPrepareValues);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div64(threads, kThreads), kPrepareMaxCtas)));
  launch_pdl(prepare_fp4_weights_kernel, grid, kThreads, 0, stream, p);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
