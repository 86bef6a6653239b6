// The 4-bit weight kernels against the CPU reference, bit for bit:
// - launch_quantize_fp4_weights: codes, block scales and (NVFP4) matrix
//   scales of each expert's matrix equal ref::quantize(variant, that
//   matrix) for MXFP4 and NVFP4, from a bf16 array and from the synthetic
//   source (the values launch_fill_bf16 writes, regenerated on the host),
//   over E = 3 and rows 1, 7, 64 by cols 32, 96, 512; special values (an
//   all-zero expert and block, a block tiny next to the matrix amax, values
//   past the saturation point, NaN of both signs), empty shapes, and
//   experts past 2^31 values;
// - launch_prepare_fp4_weights: every word through fp4_prepare_word and
//   the gate/up row reorder, done on the host, with and without interleave,
//   with a bias, for both block sizes.
// Outputs are poisoned (0xff) before each launch and carry a poisoned tail
// that must stay untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/fp4_layout.h"
#include "core/hash_random.h"
#include "gpu/gpu_test_util.h"
#include "kernels/common/fill.cuh"
#include "kernels/quant/fp4_weights.cuh"
#include "ref/ref.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;

constexpr QuantVariant kVariants[] = {QuantVariant::MXFP4, QuantVariant::NVFP4};
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr uint8_t kPoisonByte = 0xff;
constexpr uint32_t kPoisonFloat = 0xffffffffu;
constexpr std::size_t kTail = 64;  // poisoned entries past the end of every output

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

struct Shape {
  int experts, rows, cols;
  std::size_t count() const { return static_cast<std::size_t>(experts) * rows * cols; }
  std::size_t per_expert() const { return static_cast<std::size_t>(rows) * cols; }
};

std::string name(QuantVariant v, const Shape& s) {
  return to_string(v) + " E " + std::to_string(s.experts) + " rows " + std::to_string(s.rows) + " cols " +
         std::to_string(s.cols);
}

// ref::quantize of each expert's matrix: codes, block scales and global
// scales (NVFP4) concatenated.
struct Quantized {
  std::vector<uint8_t> codes, block_scales;
  std::vector<float> globals;
};
Quantized reference(QuantVariant v, const std::vector<float>& values, const Shape& s) {
  Quantized q;
  for (int e = 0; e < s.experts; ++e) {
    const ref::QuantMatrix m = ref::quantize(v, values.data() + e * s.per_expert(), s.rows, s.cols);
    q.codes.insert(q.codes.end(), m.data.begin(), m.data.end());
    q.block_scales.insert(q.block_scales.end(), m.block_scales.begin(), m.block_scales.end());
    if (v == QuantVariant::NVFP4) q.globals.push_back(m.global_scale);
  }
  return q;
}

// The values launch_fill_bf16(seed, scale) writes, as the host regenerates them.
std::vector<float> synthetic_values(std::size_t n, uint64_t seed, float scale, std::size_t first = 0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = ref::round_bf16(hash_uniform(seed, first + i) * scale);
  return v;
}

// Random bf16 values [E, rows, cols]: expert e around 2^(4e - 4), each
// element also scaled by 2^-k, k in 0..7, so that the blocks of a row get
// different scales.
std::vector<float> random_values(const Shape& s, uint64_t seed) {
  std::vector<float> x(s.count());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const int e = static_cast<int>(i / s.per_expert());
    const int k = static_cast<int>(hash64(seed ^ (i * 31)) % 8);
    x[i] = ref::round_bf16(std::ldexp(hash_uniform(seed, i), 4 * e - 4 - k));
  }
  return x;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> x(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) x[i] = ref::f32_to_bf16(v[i]);
  return x;
}

// Counts mismatches and keeps the first one's index.
struct Mismatches {
  int count = 0;
  std::size_t first = 0;
  void add(bool equal, std::size_t index) {
    if (!equal && count++ == 0) first = index;
  }
};

// `got` equals `want` then kTail poison bytes.
void expect_bytes(const char* what, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  ASSERT_EQ(got.size(), want.size() + kTail) << what;
  Mismatches m;
  for (std::size_t i = 0; i < got.size(); ++i) m.add(got[i] == (i < want.size() ? want[i] : kPoisonByte), i);
  EXPECT_EQ(m.count, 0) << what << ", first at " << m.first << " of " << want.size();
}

void expect_floats(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size() + kTail) << what;
  Mismatches m;
  for (std::size_t i = 0; i < got.size(); ++i)
    m.add(bits_of(got[i]) == (i < want.size() ? bits_of(want[i]) : kPoisonFloat), i);
  EXPECT_EQ(m.count, 0) << what << ", first at " << m.first << " of " << want.size();
}

// Outputs of one quantize launch with poisoned tails, and its scratch.
struct Rig {
  Rig(QuantVariant v, const Shape& s)
      : variant(v), shape(s),
        codes(s.count() / 2 + kTail),
        block_scales(s.count() / fp4_block_size(v) + kTail),
        globals((v == QuantVariant::NVFP4 ? s.experts : 0) + kTail),
        scratch(quantize_fp4_weights_scratch_floats(v, s.experts, s.rows, s.cols)) {}

  Fp4WeightQuantParams params(const WeightSource& source) const {
    Fp4WeightQuantParams p;
    p.variant = variant;
    p.experts = shape.experts;
    p.rows = shape.rows;
    p.cols = shape.cols;
    p.source = source;
    p.codes = codes.get();
    p.block_scales = block_scales.get();
    p.global_scales = globals.get();
    p.scratch = scratch.get();
    return p;
  }
  void run(const WeightSource& source) {
    codes.poison();
    block_scales.poison();
    globals.poison();
    scratch.poison();
    launch_quantize_fp4_weights(params(source), nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void expect_equals(const Quantized& want) const {
    expect_bytes("codes", codes.download(), want.codes);
    expect_bytes("block scales", block_scales.download(), want.block_scales);
    expect_floats("global scales", globals.download(), want.globals);
  }

  QuantVariant variant;
  Shape shape;
  DeviceBuffer<uint8_t> codes, block_scales;
  DeviceBuffer<float> globals, scratch;
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (const int rows : {1, 7, 64})
    for (const int cols : {32, 96, 512}) out.push_back({3, rows, cols});
  return out;
}

TEST(Fp4WeightsGpu, Bf16SourceMatchesReference) {
  UNIMOE_REQUIRE_GPU();
  for (const QuantVariant v : kVariants)
    for (const Shape& s : shapes()) {
      SCOPED_TRACE(name(v, s));
      const std::vector<float> x = random_values(s, 100 + s.rows + s.cols);
      DeviceBuffer<uint16_t> source(to_bf16(x));
      Rig rig(v, s);
      rig.run(bf16_weight_source(source.get()));
      rig.expect_equals(reference(v, x, s));
    }
}

TEST(Fp4WeightsGpu, SyntheticSourceMatchesReference) {
  UNIMOE_REQUIRE_GPU();
  constexpr uint64_t kSeed = 0x5eed;
  for (const QuantVariant v : kVariants)
    for (const Shape& s : shapes()) {
      SCOPED_TRACE(name(v, s));
      const uint64_t seed = kSeed + s.rows * 1000 + s.cols;
      const float scale = std::sqrt(3.0f / s.cols);  // ref::w13_scale's form
      Rig rig(v, s);
      rig.run(synthetic_weight_source(seed, scale));
      rig.expect_equals(reference(v, synthetic_values(s.count(), seed, scale), s));
      // The same outputs as quantizing what launch_fill_bf16 writes.
      DeviceBuffer<uint16_t> filled(s.count());
      launch_fill_bf16(filled.get(), filled.size(), seed, scale, nullptr);
      Rig from_fill(v, s);
      from_fill.run(bf16_weight_source(filled.get()));
      EXPECT_EQ(from_fill.codes.download(), rig.codes.download());
      EXPECT_EQ(from_fill.block_scales.download(), rig.block_scales.download());
    }
}

// E 3, rows 7, cols 96 (three MXFP4 blocks, six NVFP4 blocks a row).
// Expert 0 (values below 1/16 elsewhere), row 0: columns 0..31 all zero
// (-0 among them); columns 32..47 tiny (1e-30) next to the matrix amax, so
// that NVFP4's block scale rounds to 0; columns 64..95 values in [4, 6]
// and the matrix amax -7.5, past MXFP4's saturation point (scale 1 for
// amax 7.5); NaN and -NaN in row 1. Expert 1 is all zeros. Expert 2 holds
// values up to 1.6e29.
TEST(Fp4WeightsGpu, SpecialValues) {
  UNIMOE_REQUIRE_GPU();
  const Shape s{3, 7, 96};
  std::vector<float> v = random_values(s, 9);
  auto at = [&](int e, int r, int c) -> float& {
    return v[e * s.per_expert() + static_cast<std::size_t>(r) * s.cols + c];
  };
  for (int c = 0; c < 32; ++c) at(0, 0, c) = c % 3 == 0 ? -0.0f : 0.0f;
  for (int c = 32; c < 48; ++c) at(0, 0, c) = c % 2 ? 1e-30f : -1e-30f;
  for (int c = 64; c < 96; ++c) at(0, 0, c) = 4.0f + (c % 5) * 0.5f;
  at(0, 0, 70) = -7.5f;
  at(0, 1, 3) = kNan;
  at(0, 1, 40) = -kNan;
  for (int r = 0; r < s.rows; ++r)
    for (int c = 0; c < s.cols; ++c) {
      at(1, r, c) = 0.0f;
      at(2, r, c) *= 1e28f;
    }
  const std::vector<uint16_t> x = to_bf16(v);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = ref::bf16_to_f32(x[i]);  // what the device reads
  DeviceBuffer<uint16_t> source(x);
  for (const QuantVariant q : kVariants) {
    SCOPED_TRACE(to_string(q));
    Rig rig(q, s);
    rig.run(bf16_weight_source(source.get()));
    rig.expect_equals(reference(q, v, s));
    const std::vector<uint8_t> codes = rig.codes.download();
    const std::vector<uint8_t> scales = rig.block_scales.download();
    const std::size_t row_bytes = s.cols / 2, expert_bytes = s.per_expert() / 2;
    const int row_scales = s.cols / fp4_block_size(q);
    for (int c = 0; c < 16; ++c) EXPECT_EQ(codes[c] & 0x77, 0) << c;  // zeros
    EXPECT_EQ(codes[row_bytes + 1] >> 4, 0x7);                         // NaN: 6
    EXPECT_EQ(codes[row_bytes + 20] & 0xf, 0xf);                       // -NaN: -6
    for (std::size_t i = expert_bytes; i < 2 * expert_bytes; ++i) ASSERT_EQ(codes[i], 0) << i;
    if (q == QuantVariant::MXFP4) {
      EXPECT_EQ(scales[0], 0);          // all-zero block
      EXPECT_EQ(codes[0] & 0xf, 0x8);   // -0 stays -0
      EXPECT_EQ(scales[2], 127);  // amax 7.5: scale 2^0
      EXPECT_EQ(codes[35] & 0xf, 0xf);  // -7.5 saturates to -6
      for (int b = row_scales * s.rows; b < 2 * row_scales * s.rows; ++b) ASSERT_EQ(scales[b], 0) << b;
    } else {
      EXPECT_EQ(scales[0], 0);   // all-zero block: scale 0, elements +0
      EXPECT_EQ(codes[0], 0);
      EXPECT_EQ(scales[2], 0);  // tiny block: its scale rounds to 0
      for (int c = 16; c < 24; ++c) EXPECT_EQ(codes[c], 0) << c;  // and its elements are +0
      EXPECT_NE(scales[row_scales + 2], 0);  // row 1's blocks of small values keep their scales
      const std::vector<float> globals = rig.globals.download();
      EXPECT_EQ(globals[0], 7.5f / 2688.0f);
      EXPECT_EQ(globals[1], 1.0f);
    }
  }
}

// No expert, no row or no column: MXFP4 writes nothing; NVFP4 writes each
// expert's global scale, 1, and no code.
TEST(Fp4WeightsGpu, EmptyShapes) {
  UNIMOE_REQUIRE_GPU();
  for (const QuantVariant v : kVariants)
    for (const Shape& s : {Shape{0, 7, 96}, Shape{3, 0, 96}, Shape{3, 7, 0}, Shape{2, 0, 0}}) {
      SCOPED_TRACE(name(v, s));
      Rig rig(v, s);
      rig.run(synthetic_weight_source(1, 1.0f));
      rig.run(bf16_weight_source(nullptr));  // nothing is read
      rig.expect_equals(reference(v, {}, s));
    }
}

// 129 experts of 4096 x 4096: the last ones start past value 2^31. Only
// the last expert is compared.
TEST(Fp4WeightsGpu, IndicesPast32Bits) {
  UNIMOE_REQUIRE_GPU();
  const Shape s{129, 4096, 4096};
  ASSERT_GT(s.count(), std::size_t{1} << 31);
  const Shape last{1, s.rows, s.cols};
  constexpr uint64_t kSeed = 77;
  constexpr float kScale = 0.02f;
  const std::vector<float> values = synthetic_values(last.count(), kSeed, kScale, (s.experts - 1) * s.per_expert());
  for (const QuantVariant v : kVariants) {
    SCOPED_TRACE(to_string(v));
    Rig rig(v, s);
    rig.run(synthetic_weight_source(kSeed, kScale));
    const Quantized want = reference(v, values, last);
    std::vector<uint8_t> codes(want.codes.size()), scales(want.block_scales.size());
    UNIMOE_CUDA_CHECK(cudaMemcpy(codes.data(), rig.codes.get() + (s.experts - 1) * s.per_expert() / 2,
                                 codes.size(), cudaMemcpyDeviceToHost));
    UNIMOE_CUDA_CHECK(cudaMemcpy(scales.data(),
                                 rig.block_scales.get() + (s.experts - 1) * s.per_expert() / fp4_block_size(v),
                                 scales.size(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(codes == want.codes) << "codes of the last expert";
    EXPECT_TRUE(scales == want.block_scales) << "block scales of the last expert";
    if (v == QuantVariant::NVFP4) {
      float global = 0.0f;
      UNIMOE_CUDA_CHECK(cudaMemcpy(&global, rig.globals.get() + s.experts - 1, sizeof global, cudaMemcpyDeviceToHost));
      EXPECT_EQ(bits_of(global), bits_of(want.globals[0]));
    }
  }
}

// ---- launch_prepare_fp4_weights ----------------------------------------------

// The prepared copy on the host: destination row r of each expert from
// source row r, or (interleaved) 2r for r < rows / 2 and 2(r - rows/2) + 1
// after; codes word by word through fp4_prepare_word.
struct Prepared {
  std::vector<uint8_t> codes, scales;
  std::vector<float> bias;
};
Prepared host_prepare(const Shape& s, int block, bool interleaved, const std::vector<uint8_t>& codes,
                      const std::vector<uint8_t>& scales, const std::vector<float>& bias) {
  Prepared out;
  const std::size_t row_bytes = s.cols / 2, row_scales = s.cols / block;
  for (int e = 0; e < s.experts; ++e)
    for (int r = 0; r < s.rows; ++r) {
      const int half = s.rows / 2;
      const int src_r = !interleaved ? r : r < half ? 2 * r : 2 * (r - half) + 1;
      const std::size_t src = static_cast<std::size_t>(e) * s.rows + src_r;
      for (std::size_t w = 0; w < row_bytes / 4; ++w) {
        uint32_t word;
        std::memcpy(&word, codes.data() + src * row_bytes + 4 * w, sizeof word);
        word = fp4_prepare_word(word);
        const auto* bytes = reinterpret_cast<const uint8_t*>(&word);
        out.codes.insert(out.codes.end(), bytes, bytes + 4);
      }
      out.scales.insert(out.scales.end(), scales.begin() + src * row_scales,
                        scales.begin() + (src + 1) * row_scales);
      if (!bias.empty()) out.bias.push_back(bias[src]);
    }
  return out;
}

std::vector<uint8_t> random_bytes(std::size_t n, uint64_t seed) {
  std::vector<uint8_t> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(hash64(seed ^ (i * 0x9e3779b9ull)));
  return b;
}

TEST(Fp4WeightsGpu, PrepareMatchesHost) {
  UNIMOE_REQUIRE_GPU();
  for (const int block : {32, 16})
    for (const bool interleaved : {false, true})
      for (const bool with_bias : {false, true})
        for (const Shape& s : {Shape{3, 6, 32}, Shape{3, 64, 96}, Shape{2, 10, 512}}) {
          // A padded scale stride on the middle shape (rows of 96 / block
          // scales, 5 bytes apart more): the padding stays untouched.
          const int pad = s.cols == 96 ? 5 : 0;
          SCOPED_TRACE("block " + std::to_string(block) + (interleaved ? " interleaved" : "") +
                       (with_bias ? " bias" : "") + " E " + std::to_string(s.experts) + " rows " +
                       std::to_string(s.rows) + " cols " + std::to_string(s.cols) + " scale pad " +
                       std::to_string(pad));
          const std::size_t row_scales = s.cols / block, stride = row_scales + pad;
          const std::size_t all_rows = static_cast<std::size_t>(s.experts) * s.rows;
          const std::vector<uint8_t> codes = random_bytes(s.count() / 2, s.cols + block);
          const std::vector<uint8_t> scales = random_bytes(s.count() / block, s.rows + 7);
          std::vector<float> bias;
          if (with_bias)
            for (std::size_t i = 0; i < static_cast<std::size_t>(s.experts) * s.rows; ++i)
              bias.push_back(hash_uniform(5, i));
          DeviceBuffer<uint8_t> src_codes(codes), src_scales(scales);
          DeviceBuffer<float> src_bias(bias.size());
          if (with_bias) src_bias.upload(bias);
          DeviceBuffer<uint8_t> dst_codes(codes.size() + kTail), dst_scales(all_rows * stride + kTail);
          DeviceBuffer<float> dst_bias(bias.size() + kTail);
          dst_codes.poison();
          dst_scales.poison();
          dst_bias.poison();
          Fp4PrepareParams p;
          p.experts = s.experts;
          p.rows = s.rows;
          p.cols = s.cols;
          p.block = block;
          p.interleaved = interleaved;
          p.src_codes = src_codes.get();
          p.src_scales = src_scales.get();
          p.src_bias = with_bias ? src_bias.get() : nullptr;
          p.dst_codes = dst_codes.get();
          p.dst_scales = dst_scales.get();
          p.dst_scale_stride = pad != 0 ? static_cast<int>(stride) : 0;
          p.dst_bias = with_bias ? dst_bias.get() : nullptr;
          launch_prepare_fp4_weights(p, nullptr);
          UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
          const Prepared want = host_prepare(s, block, interleaved, codes, scales, bias);
          expect_bytes("codes", dst_codes.download(), want.codes);
          // Each row's scales at its stride; the poison between rows untouched.
          std::vector<uint8_t> want_scales(all_rows * stride, kPoisonByte);
          for (std::size_t r = 0; r < all_rows; ++r)
            std::copy(want.scales.begin() + r * row_scales, want.scales.begin() + (r + 1) * row_scales,
                      want_scales.begin() + r * stride);
          expect_bytes("block scales", dst_scales.download(), want_scales);
          expect_floats("bias", dst_bias.download(), want.bias);  // untouched without a bias
        }
}

// ---- arguments -----------------------------------------------------------------

template <typename Params, typename Launch>
void expect_refused(const Params& p, const std::string& field, Launch launch) {
  test::expect_refused<std::invalid_argument>(p, field, launch);
}

TEST(Fp4WeightsGpu, QuantizeBadArguments) {
  UNIMOE_REQUIRE_GPU();
  const Shape s{2, 8, 64};
  Rig rig(QuantVariant::NVFP4, s);
  DeviceBuffer<uint16_t> source(std::vector<uint16_t>(s.count() + 8, 0));
  const auto launch = [](const Fp4WeightQuantParams& p) { launch_quantize_fp4_weights(p, nullptr); };
  const Fp4WeightQuantParams good = rig.params(bf16_weight_source(source.get()));
  Fp4WeightQuantParams p = good;
  for (const QuantVariant v : {QuantVariant::BF16, QuantVariant::FP8Block128, QuantVariant::FP8PerTensor}) {
    p.variant = v;
    expect_refused(p, "variant", launch);
  }
  for (const int cols : {8, 24, -16}) {
    p = good;
    p.cols = cols;
    expect_refused(p, "cols", launch);
  }
  p = good;
  p.variant = QuantVariant::MXFP4;
  p.cols = 48;  // a multiple of 16, not of 32
  expect_refused(p, "cols", launch);
  p = good;
  p.rows = -1;
  expect_refused(p, "rows", launch);
  p = good;
  p.experts = -1;
  expect_refused(p, "experts", launch);
  p = good;
  p.global_scales = nullptr;
  expect_refused(p, "global_scales", launch);
  p = good;
  p.scratch = nullptr;
  expect_refused(p, "scratch", launch);
  p = good;
  p.codes = nullptr;
  expect_refused(p, "codes", launch);
  p = good;
  p.codes = rig.codes.get() + 8;
  expect_refused(p, "codes", launch);
  p = good;
  p.block_scales = nullptr;
  expect_refused(p, "block_scales", launch);
  p = good;
  p.source = bf16_weight_source(nullptr);
  expect_refused(p, "source", launch);
  p = good;
  p.source = bf16_weight_source(source.get() + 4);
  expect_refused(p, "source", launch);
  EXPECT_THROW(fp4_block_size(QuantVariant::FP8Block128), std::invalid_argument);
  EXPECT_THROW(quantize_fp4_weights_scratch_floats(QuantVariant::NVFP4, 1, 16, 8), std::invalid_argument);
  EXPECT_EQ(quantize_fp4_weights_scratch_floats(QuantVariant::MXFP4, 4, 16, 64), 0u);
  launch_quantize_fp4_weights(good, nullptr);  // the good one runs
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  // MXFP4 needs neither global scales nor scratch.
  p = good;
  p.variant = QuantVariant::MXFP4;
  p.global_scales = nullptr;
  p.scratch = nullptr;
  launch_quantize_fp4_weights(p, nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(Fp4WeightsGpu, PrepareBadArguments) {
  UNIMOE_REQUIRE_GPU();
  const Shape s{2, 6, 64};
  DeviceBuffer<uint8_t> src_codes(s.count() / 2 + 16), dst_codes(s.count() / 2 + 16);
  DeviceBuffer<uint8_t> src_scales(s.count() / 16), dst_scales(s.count() / 16);
  DeviceBuffer<float> src_bias(12), dst_bias(12);
  src_codes.poison(0);  // the cases that pass the checks launch: initialized sources
  src_scales.poison(0);
  src_bias.poison(0);
  const auto launch = [](const Fp4PrepareParams& p) { launch_prepare_fp4_weights(p, nullptr); };
  Fp4PrepareParams good;
  good.experts = s.experts;
  good.rows = s.rows;
  good.cols = s.cols;
  good.block = 16;
  good.interleaved = true;
  good.src_codes = src_codes.get();
  good.src_scales = src_scales.get();
  good.src_bias = src_bias.get();
  good.dst_codes = dst_codes.get();
  good.dst_scales = dst_scales.get();
  good.dst_bias = dst_bias.get();
  Fp4PrepareParams p = good;
  p.block = 8;
  expect_refused(p, "block", launch);
  for (const int cols : {0, 16, 48, -32}) {
    p = good;
    p.cols = cols;
    expect_refused(p, "cols", launch);
  }
  p = good;
  p.rows = 5;
  expect_refused(p, "interleaved", launch);
  p = good;
  p.rows = -2;
  expect_refused(p, "rows", launch);
  p = good;
  p.experts = -1;
  expect_refused(p, "experts", launch);
  p = good;
  p.src_codes = nullptr;
  expect_refused(p, "src_codes", launch);
  p = good;
  p.dst_codes = dst_codes.get() + 8;
  expect_refused(p, "dst_codes", launch);
  p = good;
  p.dst_codes = src_codes.get() + 16;  // aligned, but overlapping the source
  expect_refused(p, "dst_codes", launch);
  p = good;
  p.src_scales = nullptr;
  expect_refused(p, "src_scales", launch);
  p = good;
  p.dst_scales = nullptr;
  expect_refused(p, "dst_scales", launch);
  p = good;
  p.dst_bias = nullptr;
  expect_refused(p, "dst_bias", launch);
  p = good;
  p.src_bias = nullptr;
  expect_refused(p, "dst_bias", launch);
  launch_prepare_fp4_weights(good, nullptr);  // the good one runs
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace unimoe
