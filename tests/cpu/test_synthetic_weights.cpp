// ref::HostWeights: the weights the reference runs on are what the device
// holds. BF16 gives the bf16 fill's values; FP8Block128, FP8PerTensor,
// MXFP4 and NVFP4 give each expert matrix of that fill quantized and
// dequantized on its own, bit for bit, which differs from the bf16 values.
// Biases are the fp32 fill in every variant.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/hash_random.h"
#include "ref/ref.h"
#include "ref/synthetic.h"

namespace unimoe::ref {
namespace {

constexpr uint64_t kSeed = 42;

// E_local 3 of E 4 (local experts 1..3), H 256, I 384: FP8Block128's tiles
// are whole, FP8PerTensor's and NVFP4's matrix scale is the expert's, and
// both widths hold whole MXFP4 and NVFP4 blocks.
MoEConfig config_for(QuantVariant q, Activation act, bool has_bias) {
  MoEConfig c;
  c.routing.num_experts = 4;
  c.routing.top_k = 2;
  c.experts.hidden = 256;
  c.experts.intermediate = 384;
  c.experts.activation = act;
  c.experts.has_bias = has_bias;
  c.experts.local_expert_offset = 1;
  c.experts.num_local_experts = 3;
  c.experts.quant = q;
  validate(c);
  return c;
}

// Local expert e's matrix [rows, cols] of the bf16 fill (seed, scale) over
// the whole [E_local, rows, cols] array.
std::vector<float> bf16_fill(int e, int rows, int cols, uint64_t seed, float scale) {
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  std::vector<float> v(n);
  for (std::size_t j = 0; j < n; ++j) v[j] = round_bf16(hash_uniform(seed, e * n + j) * scale);
  return v;
}

bool same_bits(const float* a, const std::vector<float>& b) {
  return std::memcmp(a, b.data(), b.size() * sizeof(float)) == 0;
}

int count_different(const float* a, const std::vector<float>& b) {
  int n = 0;
  for (std::size_t j = 0; j < b.size(); ++j) n += a[j] != b[j];
  return n;
}

struct Matrices {
  std::vector<float> w13, w2;
};

Matrices bf16_matrices(const MoEConfig& c, const Seeds& s, int e) {
  const int h = c.experts.hidden, i = c.experts.intermediate, n1 = c.gemm1_cols();
  return {bf16_fill(e, n1, h, s.w13, w13_scale(c)), bf16_fill(e, h, i, s.w2, w2_scale(c))};
}

std::vector<float> round_trip(QuantVariant q, const std::vector<float>& v, int rows, int cols) {
  return dequantize(quantize(q, v.data(), rows, cols));
}

TEST(SyntheticWeights, QuantizedViewIsTheQuantizedBf16Fill) {
  for (const QuantVariant q : {QuantVariant::FP8Block128, QuantVariant::FP8PerTensor, QuantVariant::MXFP4,
                               QuantVariant::NVFP4})
    for (const Activation act : {Activation::SwiGLU, Activation::ReLU2}) {
      SCOPED_TRACE(to_string(q) + " " + to_string(act));
      const MoEConfig c = config_for(q, act, false);
      const Seeds s = seeds_for(kSeed);
      HostWeights weights(c, s);
      const int h = c.experts.hidden, i = c.experts.intermediate, n1 = c.gemm1_cols();
      for (const int e : {0, 2}) {
        SCOPED_TRACE("local expert " + std::to_string(e));
        const Matrices bf16 = bf16_matrices(c, s, e);
        const ExpertView view = weights.view(e);
        const std::vector<float> w13 = round_trip(q, bf16.w13, n1, h);
        const std::vector<float> w2 = round_trip(q, bf16.w2, h, i);
        EXPECT_TRUE(same_bits(view.w13, w13));
        EXPECT_TRUE(same_bits(view.w2, w2));
        // e4m3 keeps 3 mantissa bits of bf16's 7, e2m1 1: most values move.
        EXPECT_GT(count_different(view.w13, bf16.w13), static_cast<int>(bf16.w13.size() / 2));
        EXPECT_GT(count_different(view.w2, bf16.w2), static_cast<int>(bf16.w2.size() / 2));
        EXPECT_EQ(view.b13, nullptr);
        EXPECT_EQ(view.b2, nullptr);
      }
    }
}

TEST(SyntheticWeights, Bf16ViewIsTheBf16Fill) {
  const MoEConfig c = config_for(QuantVariant::BF16, Activation::SwiGLU, false);
  const Seeds s = seeds_for(kSeed);
  HostWeights weights(c, s);
  const Matrices bf16 = bf16_matrices(c, s, 1);
  const ExpertView view = weights.view(1);
  EXPECT_TRUE(same_bits(view.w13, bf16.w13));
  EXPECT_TRUE(same_bits(view.w2, bf16.w2));
}

TEST(SyntheticWeights, BiasesAreTheFp32FillInEveryVariant) {
  for (const QuantVariant q : {QuantVariant::BF16, QuantVariant::FP8Block128, QuantVariant::FP8PerTensor,
                               QuantVariant::MXFP4, QuantVariant::NVFP4}) {
    SCOPED_TRACE(to_string(q));
    const MoEConfig c = config_for(q, Activation::SwiGLUOai, true);
    const Seeds s = seeds_for(kSeed);
    HostWeights weights(c, s);
    const std::size_t n1 = c.gemm1_cols(), h = c.experts.hidden;
    constexpr int kExpert = 2;
    const ExpertView view = weights.view(kExpert);
    ASSERT_NE(view.b13, nullptr);
    ASSERT_NE(view.b2, nullptr);
    for (std::size_t j = 0; j < n1; ++j)
      ASSERT_EQ(view.b13[j], hash_uniform(s.b13, kExpert * n1 + j) * kBiasScale) << j;
    for (std::size_t j = 0; j < h; ++j)
      ASSERT_EQ(view.b2[j], hash_uniform(s.b2, kExpert * h + j) * kBiasScale) << j;
  }
}

}  // namespace
}  // namespace unimoe::ref
