// Bit-exact emulation of the narrow formats (e4m3, e2m1, e8m0) and of the
// scaled matrices built from them. Every rule is spelled out in
// docs/quantization.md; the device kernels must match it bit for bit.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include "ref/ref.h"

namespace unimoe::ref {
namespace {

// A sign-magnitude minifloat without infinities: `man_bits` mantissa bits,
// `min_exp` the exponent of the smallest normal (and of the subnormal binade).
struct MiniFloat {
  int man_bits;
  int min_exp;
  float max_value;
  uint8_t max_code;  // magnitude code of max_value
};
constexpr MiniFloat kE4m3{3, -6, 448.0f, 0x7e};
constexpr MiniFloat kE2m1{1, 0, 6.0f, 0x7};

constexpr uint8_t kE4m3Nan = 0x7f;
constexpr uint8_t kE4m3Sign = 0x80;
constexpr uint8_t kE2m1Sign = 0x8;
constexpr uint8_t kE8m0Nan = 0xff;
constexpr int kE8m0Bias = 127;
constexpr int kE2m1MaxExp = 2;  // 6 = 1.5 * 2^2: the "emax_elem" of the OCP MX rule

constexpr int kFp8BlockSize = 128;
constexpr int kMxBlockSize = 32;
constexpr int kNvBlockSize = 16;

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Nearest integer, ties to even. q is non-negative, small and exact, so the
// subtraction is exact and the result does not depend on the FPU mode.
float round_half_even(float q) {
  const float lower = std::floor(q);
  const float frac = q - lower;
  const bool lower_is_odd = std::fmod(lower, 2.0f) != 0.0f;
  return (frac > 0.5f || (frac == 0.5f && lower_is_odd)) ? lower + 1.0f : lower;
}

// Magnitude code of a >= 0 (not NaN). Within the binade 2^e the representable
// values are the multiples of 2^(e - man_bits); the subnormals share the step
// of the smallest normal binade. The code is ((e - min_exp) << man_bits) plus
// the rounded step count: a normal's count includes its implicit leading one,
// which supplies the +1 of its exponent field, and a count that rounds up to
// 2^(man_bits + 1) carries into the exponent field by the same addition (which
// also moves the largest subnormal up to the smallest normal).
uint8_t encode_magnitude(const MiniFloat& f, float a) {
  if (a >= f.max_value) return f.max_code;  // saturate, +inf included
  if (a == 0.0f) return 0;
  const int e = std::max(std::ilogb(a), f.min_exp);
  const float steps = round_half_even(std::ldexp(a, f.man_bits - e));  // exact scaling
  return static_cast<uint8_t>(((e - f.min_exp) << f.man_bits) + static_cast<int>(steps));
}

float decode_magnitude(const MiniFloat& f, unsigned code) {
  const unsigned exp_field = code >> f.man_bits;
  const unsigned mantissa = code & ((1u << f.man_bits) - 1u);
  if (exp_field == 0) return std::ldexp(static_cast<float>(mantissa), f.min_exp - f.man_bits);
  const unsigned significand = mantissa | (1u << f.man_bits);
  return std::ldexp(static_cast<float>(significand),
                    static_cast<int>(exp_field) - 1 + f.min_exp - f.man_bits);
}

void check_shape(int rows, int cols) {
  if (rows < 0) throw Error("rows", "must be >= 0, got " + std::to_string(rows));
  if (cols < 0) throw Error("cols", "must be >= 0, got " + std::to_string(cols));
}

void check_block_multiple(QuantVariant variant, int cols, int block) {
  if (cols % block != 0)
    throw Error("cols", to_string(variant) + " scales every " + std::to_string(block) +
                            " values along cols; cols = " + std::to_string(cols) +
                            " is not a multiple of " + std::to_string(block));
}

// Largest magnitude in rows [r0, r1) x cols [c0, c1) of a row-major matrix
// with `cols` columns. NaN is skipped so that one NaN cannot poison the scale
// of its neighbours (it still encodes to NaN, or to +-6 in e2m1).
float tile_amax(const float* values, int cols, int r0, int r1, int c0, int c1) {
  float amax = 0.0f;
  for (int r = r0; r < r1; ++r)
    for (int c = c0; c < c1; ++c)
      amax = std::fmax(amax, std::fabs(values[static_cast<std::size_t>(r) * cols + c]));
  return amax;
}

// amax / 448 maps the block's largest magnitude onto e4m3's largest finite
// value. 1 when that is 0 (amax 0, or an amax so small the quotient underflows).
float fp8_scale(float amax) {
  const float scale = amax / kE4m3.max_value;
  return scale > 0.0f ? scale : 1.0f;
}

// An fp8 matrix is cut into tiles of rows x cols (the last ones ragged),
// one scale per tile, row-major over the tile grid.
struct Tiling {
  int rows;
  int cols;
};
constexpr Tiling kWeightBlock{kFp8BlockSize, kFp8BlockSize};

// One tile over the whole matrix (at least 1 x 1 so that the index math
// holds for an empty one, which still has its one scale).
Tiling per_tensor_tiling(int rows, int cols) { return {std::max(rows, 1), std::max(cols, 1)}; }

std::vector<float> fp8_tile_scales(const float* values, int rows, int cols, Tiling t) {
  std::vector<float> scales;
  for (int r0 = 0; r0 < rows; r0 += t.rows)
    for (int c0 = 0; c0 < cols; c0 += t.cols)
      scales.push_back(fp8_scale(tile_amax(values, cols, r0, std::min(r0 + t.rows, rows), c0,
                                           std::min(c0 + t.cols, cols))));
  return scales;
}

std::size_t tile_index(int cols, Tiling t, int r, int c) {
  return static_cast<std::size_t>(r / t.rows) * ceil_div(cols, t.cols) + c / t.cols;
}

std::vector<uint8_t> fp8_encode(const float* values, int rows, int cols, Tiling t,
                                const std::vector<float>& scales) {
  std::vector<uint8_t> codes(static_cast<std::size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r) * cols + c;
      codes[i] = f32_to_e4m3(values[i] / scales[tile_index(cols, t, r, c)]);
    }
  return codes;
}

void fp8_decode(const std::vector<uint8_t>& codes, int rows, int cols, Tiling t,
                const std::vector<float>& scales, float* out) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r) * cols + c;
      out[i] = e4m3_to_f32(codes[i]) * scales[tile_index(cols, t, r, c)];
    }
}

// Replaces each value by its quantized-then-dequantized value, in place.
void fp8_round_trip(float* values, int rows, int cols, Tiling t, const std::vector<float>& scales) {
  fp8_decode(fp8_encode(values, rows, cols, t, scales), rows, cols, t, scales, values);
}

// The OCP MX shared scale 2^(floor(log2(amax)) - 2) as an e8m0 code, clamped
// to the finite codes [0, 254]. amax 0 gives code 0 (2^-127): any scale
// encodes an all-zero block exactly.
uint8_t mx_scale_code(float amax) {
  if (amax == 0.0f) return 0;
  const int exponent = std::clamp(std::ilogb(amax) - kE2m1MaxExp, -kE8m0Bias, kE8m0Bias);
  return static_cast<uint8_t>(exponent + kE8m0Bias);
}

void put_nibble(std::vector<uint8_t>& data, std::size_t i, uint8_t nibble) {
  data[i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? nibble : nibble << 4);
}

uint8_t get_nibble(const std::vector<uint8_t>& data, std::size_t i) {
  return static_cast<uint8_t>(i % 2 == 0 ? data[i / 2] & 0xf : data[i / 2] >> 4);
}

void quantize_mxfp4(const float* values, QuantMatrix& m) {
  const int blocks_per_row = m.cols / kMxBlockSize;
  m.block_scales.resize(static_cast<std::size_t>(m.rows) * blocks_per_row);
  for (int r = 0; r < m.rows; ++r)
    for (int b = 0; b < blocks_per_row; ++b) {
      const int c0 = b * kMxBlockSize;
      const uint8_t code =
          mx_scale_code(tile_amax(values, m.cols, r, r + 1, c0, c0 + kMxBlockSize));
      m.block_scales[static_cast<std::size_t>(r) * blocks_per_row + b] = code;
      const int exponent = code - kE8m0Bias;
      for (int c = c0; c < c0 + kMxBlockSize; ++c) {
        const std::size_t i = static_cast<std::size_t>(r) * m.cols + c;
        put_nibble(m.data, i, f32_to_e2m1(std::ldexp(values[i], -exponent)));
      }
    }
}

// The global scale maps the matrix amax onto 448 * 6, the largest block
// scale times the largest element; 1 when that is 0.
float nvfp4_global_scale(float amax) {
  const float global = amax / (kE4m3.max_value * kE2m1.max_value);
  return global > 0.0f ? global : 1.0f;
}

void quantize_nvfp4(const float* values, QuantMatrix& m) {
  const float global = nvfp4_global_scale(tile_amax(values, m.cols, 0, m.rows, 0, m.cols));
  m.global_scale = global;
  const int blocks_per_row = m.cols / kNvBlockSize;
  m.block_scales.resize(static_cast<std::size_t>(m.rows) * blocks_per_row);
  for (int r = 0; r < m.rows; ++r)
    for (int b = 0; b < blocks_per_row; ++b) {
      const int c0 = b * kNvBlockSize;
      const float amax = tile_amax(values, m.cols, r, r + 1, c0, c0 + kNvBlockSize);
      const uint8_t code = f32_to_e4m3(amax / kE2m1.max_value / global);
      m.block_scales[static_cast<std::size_t>(r) * blocks_per_row + b] = code;
      // A block scale that rounds to 0 (or a divisor that underflows) can
      // only encode zeros: the elements are +0 instead of x / 0.
      const float divisor = e4m3_to_f32(code) * global;
      for (int c = c0; c < c0 + kNvBlockSize; ++c) {
        const std::size_t i = static_cast<std::size_t>(r) * m.cols + c;
        put_nibble(m.data, i, divisor > 0.0f ? f32_to_e2m1(values[i] / divisor) : 0);
      }
    }
}

void check_size(const char* field, std::size_t actual, std::size_t expected) {
  if (actual != expected)
    throw Error(field, "holds " + std::to_string(actual) + " entries; the matrix needs " +
                           std::to_string(expected));
}

}  // namespace

uint8_t f32_to_e4m3(float v) {
  if (std::isnan(v)) return kE4m3Nan;
  const uint8_t sign = std::signbit(v) ? kE4m3Sign : 0;
  return sign | encode_magnitude(kE4m3, std::fabs(v));
}

float e4m3_to_f32(uint8_t bits) {
  if ((bits & kE4m3Nan) == kE4m3Nan) return NAN;  // 0x7f and 0xff
  const float magnitude = decode_magnitude(kE4m3, bits & 0x7fu);
  return (bits & kE4m3Sign) ? -magnitude : magnitude;
}

uint8_t f32_to_e2m1(float v) {
  const uint8_t sign = std::signbit(v) ? kE2m1Sign : 0;
  if (std::isnan(v)) return sign | kE2m1.max_code;
  return sign | encode_magnitude(kE2m1, std::fabs(v));
}

float e2m1_to_f32(uint8_t nibble) {
  const float magnitude = decode_magnitude(kE2m1, nibble & 0x7u);
  return (nibble & kE2m1Sign) ? -magnitude : magnitude;
}

float e8m0_to_f32(uint8_t bits) {
  if (bits == kE8m0Nan) return NAN;
  return std::ldexp(1.0f, static_cast<int>(bits) - kE8m0Bias);
}

QuantMatrix quantize(QuantVariant variant, const float* values, int rows, int cols) {
  check_shape(rows, cols);
  QuantMatrix m;
  m.variant = variant;
  m.rows = rows;
  m.cols = cols;
  const std::size_t count = static_cast<std::size_t>(rows) * cols;
  switch (variant) {
    case QuantVariant::BF16:
      m.data.resize(2 * count);
      for (std::size_t i = 0; i < count; ++i) {
        const uint16_t bits = f32_to_bf16(values[i]);
        m.data[2 * i] = static_cast<uint8_t>(bits & 0xffu);
        m.data[2 * i + 1] = static_cast<uint8_t>(bits >> 8);
      }
      break;
    case QuantVariant::FP8PerTensor:
      m.scales = {fp8_scale(tile_amax(values, cols, 0, rows, 0, cols))};
      m.data = fp8_encode(values, rows, cols, per_tensor_tiling(rows, cols), m.scales);
      break;
    case QuantVariant::FP8Block128:
      m.scales = fp8_tile_scales(values, rows, cols, kWeightBlock);
      m.data = fp8_encode(values, rows, cols, kWeightBlock, m.scales);
      break;
    case QuantVariant::MXFP4:
      check_block_multiple(variant, cols, kMxBlockSize);
      m.data.assign(count / 2, 0);
      quantize_mxfp4(values, m);
      break;
    case QuantVariant::NVFP4:
      check_block_multiple(variant, cols, kNvBlockSize);
      m.data.assign(count / 2, 0);
      quantize_nvfp4(values, m);
      break;
  }
  return m;
}

std::vector<float> dequantize(const QuantMatrix& m) {
  check_shape(m.rows, m.cols);
  const std::size_t count = static_cast<std::size_t>(m.rows) * m.cols;
  std::vector<float> out(count);
  switch (m.variant) {
    case QuantVariant::BF16:
      check_size("data", m.data.size(), 2 * count);
      for (std::size_t i = 0; i < count; ++i)
        out[i] = bf16_to_f32(static_cast<uint16_t>(m.data[2 * i] | (m.data[2 * i + 1] << 8)));
      break;
    case QuantVariant::FP8PerTensor:
      check_size("data", m.data.size(), count);
      check_size("scales", m.scales.size(), 1);
      fp8_decode(m.data, m.rows, m.cols, per_tensor_tiling(m.rows, m.cols), m.scales, out.data());
      break;
    case QuantVariant::FP8Block128:
      check_size("data", m.data.size(), count);
      check_size("scales", m.scales.size(),
                 static_cast<std::size_t>(ceil_div(m.rows, kFp8BlockSize)) *
                     ceil_div(m.cols, kFp8BlockSize));
      fp8_decode(m.data, m.rows, m.cols, kWeightBlock, m.scales, out.data());
      break;
    case QuantVariant::MXFP4:
      check_block_multiple(m.variant, m.cols, kMxBlockSize);
      check_size("data", m.data.size(), count / 2);
      check_size("block_scales", m.block_scales.size(), count / kMxBlockSize);
      // e2m1 times a power of two: exact.
      for (std::size_t i = 0; i < count; ++i)
        out[i] = e2m1_to_f32(get_nibble(m.data, i)) * e8m0_to_f32(m.block_scales[i / kMxBlockSize]);
      break;
    case QuantVariant::NVFP4:
      check_block_multiple(m.variant, m.cols, kNvBlockSize);
      check_size("data", m.data.size(), count / 2);
      check_size("block_scales", m.block_scales.size(), count / kNvBlockSize);
      // e2m1 * e4m3 is exact (at most 6 significant bits), so the only
      // rounding is the multiplication by the global scale, which a GEMM may
      // therefore apply once in its epilogue.
      for (std::size_t i = 0; i < count; ++i)
        out[i] = e2m1_to_f32(get_nibble(m.data, i)) *
                 e4m3_to_f32(m.block_scales[i / kNvBlockSize]) * m.global_scale;
      break;
  }
  return out;
}

std::vector<float> fp8_near_ties(QuantVariant variant, const float* values, int rows, int cols,
                                 float static_scale, double margin, const float* slack) {
  check_shape(rows, cols);
  const std::size_t count = static_cast<std::size_t>(rows) * cols;
  std::vector<float> ties(count, std::numeric_limits<float>::quiet_NaN());
  Tiling t{};
  std::vector<float> scales;
  if (variant == QuantVariant::FP8PerTensor) {
    t = per_tensor_tiling(rows, cols);
    scales = {static_scale != 0.0f ? static_scale
                                   : fp8_scale(tile_amax(values, cols, 0, rows, 0, cols))};
  } else if (variant == QuantVariant::FP8Block128) {
    t = Tiling{1, kFp8BlockSize};
    scales = fp8_tile_scales(values, rows, cols, t);
  } else {
    return ties;
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r) * cols + c;
      const float scale = scales[tile_index(cols, t, r, c)];
      const float q = values[i] / scale;
      if (!std::isfinite(q)) continue;
      const uint8_t code = f32_to_e4m3(q);
      const float got = std::fabs(e4m3_to_f32(code));
      const int magnitude = code & 0x7f;
      // The neighbour on q's side of the code (sign and magnitude apart;
      // 0x7e is the largest finite magnitude, beyond it q saturates).
      const int other = std::fabs(q) > got ? magnitude + 1 : magnitude - 1;
      if (other < 0 || other > 0x7e) continue;
      const float next = e4m3_to_f32(static_cast<uint8_t>(other));
      const double boundary = 0.5 * (static_cast<double>(got) + next);
      const double near = std::max(margin * std::fabs(q),
                                   slack != nullptr ? slack[i] / static_cast<double>(scale) : 0.0);
      if (std::fabs(std::fabs(static_cast<double>(q)) - boundary) > near) continue;
      ties[i] = std::copysign(next, q) * scale;
    }
  return ties;
}

void quantize_activation(QuantVariant variant, float* values, int rows, int cols,
                         float static_scale) {
  check_shape(rows, cols);
  if (static_scale != 0.0f && variant != QuantVariant::FP8PerTensor)
    throw Error("static_scale", "only FP8PerTensor takes a static activation scale; " +
                                    to_string(variant) + " computes its own");
  if (static_scale < 0.0f || !std::isfinite(static_scale))
    throw Error("static_scale", "must be a positive finite scale, or 0 for the dynamic one");
  const std::size_t count = static_cast<std::size_t>(rows) * cols;
  switch (variant) {
    case QuantVariant::BF16:
    case QuantVariant::MXFP4:
    case QuantVariant::NVFP4:
      for (std::size_t i = 0; i < count; ++i) values[i] = round_bf16(values[i]);
      break;
    case QuantVariant::FP8PerTensor:
      fp8_round_trip(values, rows, cols, per_tensor_tiling(rows, cols),
                     {static_scale != 0.0f ? static_scale
                                           : fp8_scale(tile_amax(values, cols, 0, rows, 0, cols))});
      break;
    case QuantVariant::FP8Block128: {
      const Tiling per_token{1, kFp8BlockSize};  // one scale per row and 128 columns
      fp8_round_trip(values, rows, cols, per_token, fp8_tile_scales(values, rows, cols, per_token));
      break;
    }
  }
}

}  // namespace unimoe::ref
