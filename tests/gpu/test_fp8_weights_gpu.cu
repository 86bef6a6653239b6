// The e4m3 weight quantize kernels against the CPU reference, bit for bit:
// codes and scales of each expert's matrix equal ref::quantize(variant,
// that matrix) for FP8Block128 and FP8PerTensor, from a bf16 array and from
// the synthetic source (the values launch_fill_bf16 writes, regenerated on
// the host). Ragged tiles (rows 200, cols 144), several experts, special
// values (a zero tile, NaN, an element landing on 448, an all-zero and an
// all-NaN expert), empty shapes, a per-tensor matrix larger than one grid-
// stride step, and experts past 2^31 elements. Outputs are poisoned (0xff)
// before each launch and carry a poisoned tail that must stay untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/hash_random.h"
#include "gpu/gpu_test_util.h"
#include "kernels/common/fill.cuh"
#include "kernels/quant/fp8_weights.cuh"
#include "ref/ref.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;

constexpr QuantVariant kVariants[] = {QuantVariant::FP8Block128, QuantVariant::FP8PerTensor};
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr uint32_t kPoisonScale = 0xffffffffu;
constexpr uint8_t kPoisonCode = 0xff;  // e4m3 NaN, which the encoder never emits (it gives 0x7f)
constexpr std::size_t kTail = 64;      // poisoned entries past the end of every output

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
  return to_string(v) + " E " + std::to_string(s.experts) + " rows " + std::to_string(s.rows) +
         " cols " + std::to_string(s.cols);
}

// ref::quantize of each expert's matrix, codes and scales concatenated.
struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};
Quantized reference(QuantVariant v, const std::vector<float>& values, const Shape& s) {
  Quantized q;
  for (int e = 0; e < s.experts; ++e) {
    const ref::QuantMatrix m = ref::quantize(v, values.data() + e * s.per_expert(), s.rows, s.cols);
    q.codes.insert(q.codes.end(), m.data.begin(), m.data.end());
    q.scales.insert(q.scales.end(), m.scales.begin(), m.scales.end());
  }
  return q;
}

// The values launch_fill_bf16(seed, scale) writes, as the host regenerates them.
std::vector<float> synthetic_values(std::size_t n, uint64_t seed, float scale, std::size_t first = 0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = ref::round_bf16(hash_uniform(seed, first + i) * scale);
  return v;
}

// Random bf16 bits [E, rows, cols], expert e spread over +-2^(4e - 4).
std::vector<uint16_t> random_bf16(const Shape& s, uint64_t seed) {
  std::vector<uint16_t> x(s.count());
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = ref::f32_to_bf16(std::ldexp(hash_uniform(seed, i), 4 * static_cast<int>(i / s.per_expert()) - 4));
  return x;
}

std::vector<float> to_f32(const std::vector<uint16_t>& x) {
  std::vector<float> f(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) f[i] = ref::bf16_to_f32(x[i]);
  return f;
}

// Counts mismatches and keeps the first one's index.
struct Mismatches {
  int count = 0;
  std::size_t first = 0;
  void add(bool equal, std::size_t index) {
    if (!equal && count++ == 0) first = index;
  }
};

// Outputs of one launch with poisoned tails, and its scratch.
struct Rig {
  Rig(QuantVariant v, const Shape& s)
      : variant(v), shape(s),
        codes(s.count() + kTail),
        scales(fp8_weight_scale_count(v, s.experts, s.rows, s.cols) + kTail),
        scratch(quantize_fp8_weights_scratch_floats(v, s.experts, s.rows, s.cols)) {}

  Fp8WeightQuantParams params(const WeightSource& source) const {
    Fp8WeightQuantParams p;
    p.variant = variant;
    p.experts = shape.experts;
    p.rows = shape.rows;
    p.cols = shape.cols;
    p.source = source;
    p.codes = codes.get();
    p.scales = scales.get();
    p.scratch = scratch.get();
    return p;
  }
  void run(const WeightSource& source) {
    codes.poison();
    scales.poison();
    scratch.poison();
    launch_quantize_fp8_weights(params(source), nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Codes and scales equal `want` exactly; the tails still hold the poison.
  void expect_equals(const Quantized& want) const {
    const std::vector<uint8_t> got_codes = codes.download();
    const std::vector<float> got_scales = scales.download();
    ASSERT_EQ(got_codes.size(), want.codes.size() + kTail);
    ASSERT_EQ(got_scales.size(), want.scales.size() + kTail);
    Mismatches c, s;
    for (std::size_t i = 0; i < got_codes.size(); ++i)
      c.add(got_codes[i] == (i < want.codes.size() ? want.codes[i] : kPoisonCode), i);
    for (std::size_t i = 0; i < got_scales.size(); ++i)
      s.add(bits_of(got_scales[i]) == (i < want.scales.size() ? bits_of(want.scales[i]) : kPoisonScale), i);
    EXPECT_EQ(s.count, 0) << "scales, first at " << s.first << " of " << want.scales.size();
    EXPECT_EQ(c.count, 0) << "codes, first at " << c.first << " of " << want.codes.size();
  }

  QuantVariant variant;
  Shape shape;
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales, scratch;
};

constexpr Shape kShapes[] = {
    {3, 200, 144},  // ragged tiles both ways, several experts
    {2, 256, 384},  // whole tiles
    {1, 1, 16},     // one row, the narrowest width
    {4, 130, 16},   // a 2-row last tile
    {2, 96, 1008},  // one tile row, 8 tile columns, the last 112 wide
};

TEST(Fp8WeightsGpu, Bf16SourceMatchesReference) {
  UNIMOE_REQUIRE_GPU();
  for (const QuantVariant v : kVariants)
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(name(v, s));
      const std::vector<uint16_t> x = random_bf16(s, 100 + s.rows + s.cols);
      DeviceBuffer<uint16_t> source(x);
      Rig rig(v, s);
      rig.run(bf16_weight_source(source.get()));
      rig.expect_equals(reference(v, to_f32(x), s));
    }
}

TEST(Fp8WeightsGpu, SyntheticSourceMatchesReference) {
  UNIMOE_REQUIRE_GPU();
  constexpr uint64_t kSeed = 0x5eed;
  for (const QuantVariant v : kVariants)
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(name(v, s));
      const float scale = std::sqrt(3.0f / s.cols);  // ref::w13_scale's form
      Rig rig(v, s);
      rig.run(synthetic_weight_source(kSeed + s.rows, scale));
      rig.expect_equals(reference(v, synthetic_values(s.count(), kSeed + s.rows, scale), s));
      // The same codes as quantizing what launch_fill_bf16 writes.
      DeviceBuffer<uint16_t> filled(s.count());
      launch_fill_bf16(filled.get(), filled.size(), kSeed + s.rows, scale, nullptr);
      Rig from_fill(v, s);
      from_fill.run(bf16_weight_source(filled.get()));
      EXPECT_EQ(from_fill.codes.download(), rig.codes.download());
    }
}

// E 3, rows 200, cols 144 (tiles 2 x 2 of an expert, the last ragged):
// expert 0 has an all-zero tile (0, 0) with -0 in it, a NaN in tile (0, 1)
// and its amax 3 in tile (1, 1) at a negative element; expert 1 is all
// zeros; expert 2 is all NaN.
TEST(Fp8WeightsGpu, SpecialValues) {
  UNIMOE_REQUIRE_GPU();
  const Shape s{3, 200, 144};
  std::vector<float> v = to_f32(random_bf16(s, 9));
  auto at = [&](int e, int r, int c) -> float& { return v[e * s.per_expert() + static_cast<std::size_t>(r) * s.cols + c]; };
  for (int r = 0; r < 128; ++r)
    for (int c = 0; c < 128; ++c) at(0, r, c) = (r + c) % 3 == 0 ? -0.0f : 0.0f;
  at(0, 5, 130) = kNan;
  at(0, 199, 143) = -3.0f;  // expert 0's values are in +-1/16 elsewhere
  for (int r = 0; r < s.rows; ++r)
    for (int c = 0; c < s.cols; ++c) {
      at(1, r, c) = 0.0f;
      at(2, r, c) = kNan;
    }
  std::vector<uint16_t> x(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) x[i] = ref::f32_to_bf16(v[i]);
  DeviceBuffer<uint16_t> source(x);
  const std::size_t last = (static_cast<std::size_t>(199) * s.cols + 143);  // expert 0's amax element
  for (const QuantVariant q : kVariants) {
    SCOPED_TRACE(to_string(q));
    Rig rig(q, s);
    rig.run(bf16_weight_source(source.get()));
    rig.expect_equals(reference(q, v, s));
    const std::vector<uint8_t> codes = rig.codes.download();
    const std::vector<float> scales = rig.scales.download();
    const std::size_t e1 = s.per_expert(), e2 = 2 * s.per_expert();
    EXPECT_EQ(codes[5 * s.cols + 130], 0x7f);  // NaN
    EXPECT_EQ(codes[last], 0xfe);               // -3 lands on -448
    EXPECT_EQ(codes[1], 0x00);
    EXPECT_EQ(codes[0], 0x80);                  // -0
    for (std::size_t i = e1; i < e2; ++i) ASSERT_EQ(codes[i] & 0x7f, 0) << i;
    for (std::size_t i = e2; i < 3 * s.per_expert(); ++i) ASSERT_EQ(codes[i], 0x7f) << i;
    if (q == QuantVariant::FP8Block128) {
      EXPECT_EQ(scales[0], 1.0f);            // the zero tile
      EXPECT_EQ(scales[3], 3.0f / 448.0f);   // tile (1, 1): amax 3
      for (int t = 4; t < 12; ++t) EXPECT_EQ(scales[t], 1.0f) << t;  // all zeros, all NaN
      // The NaN does not reach tile (0, 1)'s scale: that of the tile without it.
      std::vector<float> without = v;
      without[5 * s.cols + 130] = 0.0f;
      EXPECT_EQ(bits_of(scales[1]), bits_of(reference(q, without, s).scales[1]));
    } else {
      EXPECT_EQ(scales[0], 3.0f / 448.0f);
      EXPECT_EQ(scales[1], 1.0f);
      EXPECT_EQ(scales[2], 1.0f);
    }
  }
}

// No expert, no row or no column: FP8Block128 writes nothing; FP8PerTensor
// writes each expert's scale, 1, and no code.
TEST(Fp8WeightsGpu, EmptyShapes) {
  UNIMOE_REQUIRE_GPU();
  for (const QuantVariant v : kVariants)
    for (const Shape& s : {Shape{0, 200, 144}, Shape{3, 0, 144}, Shape{3, 200, 0}, Shape{2, 0, 0}}) {
      SCOPED_TRACE(name(v, s));
      Rig rig(v, s);
      rig.run(synthetic_weight_source(1, 1.0f));
      rig.run(bf16_weight_source(nullptr));  // nothing is read
      rig.expect_equals(reference(v, {}, s));
    }
}

// More vectors an expert than the per-tensor form's CTAs cover in one step
// (1024 CTAs x 256 threads x 8 values), its amax planted near the end.
TEST(Fp8WeightsGpu, PerTensorLargeMatrix) {
  UNIMOE_REQUIRE_GPU();
  const Shape s{2, 1100, 2048};
  std::vector<uint16_t> x = random_bf16(s, 21);
  x[s.per_expert() - 5] = ref::f32_to_bf16(-40.0f);
  x[s.per_expert() + 3] = ref::f32_to_bf16(kNan);
  DeviceBuffer<uint16_t> source(x);
  for (const QuantVariant v : kVariants) {
    SCOPED_TRACE(to_string(v));
    Rig rig(v, s);
    rig.run(bf16_weight_source(source.get()));
    rig.expect_equals(reference(v, to_f32(x), s));
  }
}

// 129 experts of 4096 x 4096: the last ones start past element 2^31.
// Only the last expert is compared (its codes and scales downloaded alone).
TEST(Fp8WeightsGpu, IndicesPast32Bits) {
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
    std::vector<uint8_t> codes(last.count());
    std::vector<float> scales(want.scales.size());
    const std::size_t scale_offset = fp8_weight_scale_count(v, s.experts - 1, s.rows, s.cols);
    UNIMOE_CUDA_CHECK(cudaMemcpy(codes.data(), rig.codes.get() + (s.experts - 1) * s.per_expert(),
                                 codes.size(), cudaMemcpyDeviceToHost));
    UNIMOE_CUDA_CHECK(cudaMemcpy(scales.data(), rig.scales.get() + scale_offset, scales.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost));
    EXPECT_TRUE(codes == want.codes) << "codes of the last expert";
    Mismatches m;
    for (std::size_t i = 0; i < scales.size(); ++i) m.add(bits_of(scales[i]) == bits_of(want.scales[i]), i);
    EXPECT_EQ(m.count, 0) << "scales of the last expert, first at " << m.first;
  }
}

// Each bad argument is refused with std::invalid_argument naming its field.
TEST(Fp8WeightsGpu, BadArguments) {
  UNIMOE_REQUIRE_GPU();
  const Shape s{2, 64, 32};
  Rig rig(QuantVariant::FP8PerTensor, s);
  DeviceBuffer<uint16_t> source(std::vector<uint16_t>(s.count() + 8, 0));
  auto expect_refused = [&](Fp8WeightQuantParams p, const std::string& field) {
    try {
      launch_quantize_fp8_weights(p, nullptr);
      ADD_FAILURE() << "accepted; expected a refusal naming " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  const Fp8WeightQuantParams good = rig.params(bf16_weight_source(source.get()));
  Fp8WeightQuantParams p = good;
  p.variant = QuantVariant::BF16;
  expect_refused(p, "variant");
  p = good;
  p.variant = QuantVariant::MXFP4;
  expect_refused(p, "variant");
  for (const int cols : {8, 24, -16}) {
    p = good;
    p.cols = cols;
    expect_refused(p, "cols");
  }
  p = good;
  p.rows = -1;
  expect_refused(p, "rows");
  p = good;
  p.experts = -1;
  expect_refused(p, "experts");
  p = good;
  p.scales = nullptr;
  expect_refused(p, "scales");
  p = good;
  p.scratch = nullptr;
  expect_refused(p, "scratch");
  p = good;
  p.codes = nullptr;
  expect_refused(p, "codes");
  p = good;
  p.codes = rig.codes.get() + 8;
  expect_refused(p, "codes");
  p = good;
  p.source = bf16_weight_source(nullptr);
  expect_refused(p, "source");
  p = good;
  p.source = bf16_weight_source(source.get() + 4);
  expect_refused(p, "source");
  EXPECT_THROW(fp8_weight_scale_count(QuantVariant::NVFP4, 1, 16, 16), std::invalid_argument);
  EXPECT_THROW(quantize_fp8_weights_scratch_floats(QuantVariant::FP8PerTensor, 1, 16, 8),
               std::invalid_argument);
  launch_quantize_fp8_weights(good, nullptr);  // the good one runs
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace unimoe
