// The CPU reference: the oracle every kernel and backend is tested against.
// Plain host C++, no CUDA headers. Accumulation is in fp64; the only
// roundings are those the device contract has too (bf16 inputs, bf16 or
// quantized activations between the GEMMs, quantized weights), each done by
// the bit-exact emulation in this file's quant section.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "unimoe/unimoe.h"

namespace unimoe::ref {

// ------------------------------------------------------------- routing ----
// ids and weights [T, K], row-major. Exact formulas: docs/routing.md.
// Selection: K largest keys, ties to the lower expert index, a NaN logit
// counts as -inf and never wins over a number. Where the policy's score is a
// strictly increasing function of the logit (softmax, sigmoid), the key is
// the logit itself: the same ids in exact arithmetic, and no false ties where
// sigmoid or softmax round two different logits to one float.
struct Routing {
  int num_tokens = 0;
  int top_k = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// logits [T, E] fp32; bias [E] or nullptr (only DeepSeekV3 / MiniMax2).
Routing route(const RoutingConfig& config, const float* logits, int num_tokens,
              const float* bias);

// --------------------------------------------------------- permutation ----
// Rows of expert e (local index) are permuted rows [offsets[e], offsets[e+1]),
// in increasing expanded index (a stable sort). Rows routed to experts outside
// [local_offset, local_offset + num_local) are off this rank:
// expanded_to_permuted = -1 and they appear in no expert. Any int32 id is
// taken: -1, ids >= E and INT_MIN are off rank like another rank's experts.
struct Permutation {
  std::vector<int32_t> expert_counts;         // [E_local]
  std::vector<int32_t> expert_offsets;        // [E_local + 1], exclusive scan of counts
  std::vector<int32_t> permuted_to_expanded;  // [expert_offsets[E_local]]
  std::vector<int32_t> expanded_to_permuted;  // [T * K], -1 off rank
};

Permutation permute(const int32_t* ids, int num_tokens, int top_k, int local_offset,
                    int num_local);

// The GEMM tile schedule for one M tile size: expert e's rows are cut into
// ceil(count / tile_m) tiles, experts in order, empty experts get none.
struct Tile {
  int32_t expert;     // local expert index
  int32_t row_start;  // first permuted row of the tile
  int32_t rows;       // valid rows, 1..tile_m
};
std::vector<Tile> make_tiles(const Permutation& perm, int tile_m);

// ---------------------------------------------------------- activation ----
// Gated activations take the gate g and up u; ReLU2 takes g only (u unused).
// SwiGLUOai: g = min(g, limit), u = clamp(u, -limit, limit),
// out = g * sigmoid(alpha * g) * (u + 1).
double activate(Activation act, double g, double u, double alpha, double limit);

// --------------------------------------------------------------- quant ----
// Bit-exact conversions. Rounding is to nearest, ties to even.
uint16_t f32_to_bf16(float v);  // NaN stays NaN (quiet), inf stays inf
float bf16_to_f32(uint16_t bits);
float round_bf16(float v);

// e4m3 "fn": no infinities, max finite 448, NaN 0x7f / 0xff. Values beyond
// 448 in magnitude (inf included) saturate to +-448; NaN gives 0x7f.
uint8_t f32_to_e4m3(float v);
float e4m3_to_f32(uint8_t bits);

// e2m1 (4 bits): values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; beyond 6 saturates.
// NaN is not representable: it gives +6 with the sign of the input's bit.
uint8_t f32_to_e2m1(float v);
float e2m1_to_f32(uint8_t nibble);

// e8m0: a power of two 2^(bits - 127); 0xff is NaN.
float e8m0_to_f32(uint8_t bits);

// A quantized matrix [rows, cols], row-major, quantized along cols (the
// GEMM's K). fp4 data packs two values a byte, the lower column in the low
// nibble.
struct QuantMatrix {
  QuantVariant variant = QuantVariant::BF16;
  int rows = 0;
  int cols = 0;
  std::vector<uint8_t> data;    // bf16 (2 bytes a value), e4m3, or packed e2m1
  std::vector<float> scales;    // FP8PerTensor: 1; FP8Block128: [ceil(rows/128), ceil(cols/128)]
  std::vector<uint8_t> block_scales;  // MXFP4: e8m0 [rows, cols/32]; NVFP4: e4m3 [rows, cols/16]
  float global_scale = 1.0f;    // NVFP4: the fp32 scale per matrix
};

// Scales are chosen from the block's largest magnitude (amax):
//   FP8PerTensor, FP8Block128: scale = amax / 448 (1 when amax is 0);
//   MXFP4: scale = 2^(floor(log2(amax)) - 2), the OCP MX rule;
//   NVFP4: global = amax_matrix / (448 * 6), block scale = e4m3(amax_block / 6 / global).
QuantMatrix quantize(QuantVariant variant, const float* values, int rows, int cols);
std::vector<float> dequantize(const QuantMatrix& m);

// The activation rounding each variant applies to a GEMM's input [rows, cols]
// (x before GEMM1, the activated intermediate before GEMM2), in place:
//   BF16, MXFP4, NVFP4: bf16;
//   FP8PerTensor: e4m3 with one dynamic scale amax / 448 over the whole tensor;
//   FP8Block128: e4m3 with a scale per row and 128 columns.
// static_scale (FP8PerTensor only; 0: dynamic) replaces the dynamic scale:
// values beyond 448 * static_scale saturate. Throws Error (field
// "static_scale") for a negative or non-finite one, or one given to another
// variant.
void quantize_activation(QuantVariant variant, float* values, int rows, int cols,
                         float static_scale = 0.0f);

// The FP8 variants' near ties: for each element of values [rows, cols] that
// quantize_activation (same variant and static_scale) rounds to an e4m3
// code, where the element lies within `margin` (relative) of the rounding
// boundary to the neighbouring code, or within slack[i] (absolute, in the
// values' units; slack may be null) of it, the value it takes when rounded
// to that neighbour instead (code times scale); NaN for every other
// element, and for every element of the other variants.
std::vector<float> fp8_near_ties(QuantVariant variant, const float* values, int rows, int cols,
                                 float static_scale, double margin,
                                 const float* slack = nullptr);

// ------------------------------------------------------------- forward ----
// One local expert's weights as the device sees them, already dequantized:
// w13 [gemm1_cols, H] (gate rows first, then up rows), w2 [H, I], biases fp32
// (nullptr when the config has none).
struct ExpertView {
  const float* w13 = nullptr;
  const float* w2 = nullptr;
  const float* b13 = nullptr;
  const float* b2 = nullptr;
};
// Called only for experts that some row is routed to, so a DeepSeek-V3-sized
// layer needs only the hit experts' weights in memory. Must be thread-safe.
using WeightSource = std::function<ExpertView(int local_expert)>;

// out [T, H] (fp32, not rounded) = sum over k of weight * expert(x) for the
// rows routed to this rank; rows off rank contribute nothing, and so does an
// id outside [0, E) (docs/design.md, "Inputs outside the usual range"). A
// token's repeated id adds that expert's output once per entry, each with its
// own weight; weights are used as given, so a NaN or inf weight on a row that
// contributes makes that token's output non-finite. x [T, H] is taken as
// given (the caller passes bf16 values); each GEMM input is rounded by
// quantize_activation for config.experts.quant, with the static scales of
// `scales` where given. threads = 0: all cores.
struct ActivationScales {
  float x = 0.0f;    // FP8PerTensor: static scale of GEMM1's input (ExpertWeights::x_scale); 0: dynamic
  float act = 0.0f;  // FP8PerTensor: static scale of GEMM2's input (ExpertWeights::act_scale); 0: dynamic
};
//
// flip_allowance, where given (FP8 variants): GEMM1's sums reach the
// intermediate's e4m3 rounding in whatever order a kernel adds them, so an
// element within kFlipMargin of a rounding boundary (fp8_near_ties) may
// round to either code. Set to a bound on the L2 norm of the output change
// those elements' other codes make: per token the sum of their changes'
// norms, over tokens the root of the squares (tokens' rows are disjoint).
// 0 where none is that close, and for the other variants. A check of a
// device's output may allow that much more error than its bound
// (relative_flip_allowance): at T = 1 and I = 128 one such element can
// move the output by 2e-2 (docs/quantization.md, "Limits").
//
// gemm1_sum_precision > 0 widens "close" for a device path whose GEMM1 sums
// are coarser than fp32: each sum may then be off by that fraction of the
// sum of its terms' magnitudes (kFp8WgmmaSumPrecision for the FP8 wgmma
// paths), which moves the activation by up to what the activation of the
// sums moved that far moves; an element within that of a boundary may
// round either way too. Such elements' changes are added in quadrature per
// token (each moves the output along its own column of w2, and those
// columns are near orthogonal), to the sum of the kFlipMargin elements'.
inline constexpr double kFlipMargin = 1e-4;
// Hopper's FP8 wgmma adds the products of a k-step into an accumulator that
// keeps about 14 bits, not fp32's 24 (the reason DeepSeek's and CUTLASS's
// blockwise FP8 GEMMs promote each 128-wide K block to fp32 registers).
// docs/quantization.md ("Limits") has the fuzzer cases this explains.
inline constexpr double kFp8WgmmaSumPrecision = 1.0 / 16384;
std::vector<float> moe_forward(const MoEConfig& config, const WeightSource& weights,
                               const float* x, const Routing& routing, int threads = 0,
                               const ActivationScales& scales = {},
                               double* flip_allowance = nullptr,
                               double gemm1_sum_precision = 0.0);

// flip_allowance relative to the L2 norm of want's finite elements (a
// relative L2 check skips the others); 0 where that norm is 0.
double relative_flip_allowance(double flip_allowance, const std::vector<float>& want);

}  // namespace unimoe::ref
