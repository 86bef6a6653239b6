// The row kernels the FP8 paths add around their GEMMs, against the CPU
// reference: the quantize kernels on fp32 input with group-major scales
// (scale of (row r, group g) at scales[g * ld + r]) and the per-tensor
// scale broadcast to every (row, group); the gather of e4m3 rows and their
// scales into permuted order; the activation kernel's fp32 output; the
// activation kernel with its quantization fused (FP8Block128's cutlass
// path) against the activation kernel then the quantize kernel; the
// quantization of x scattered to the permuted rows against the quantize
// kernel then the gather. Codes
// and scales are compared bit for bit; outputs are poisoned (0xff) first and
// what must not be written is checked to still hold the poison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/hash_random.h"
#include "gpu/gpu_test_util.h"
#include "kernels/permute/expert_rows.cuh"
#include "kernels/quant/fp8_quant.cuh"
#include "ref/ref.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;

constexpr uint32_t kPoison = 0xffffffffu;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// fp32 values [rows, cols], row r spread over 2^(r % 9 - 4): each group's
// scale differs from its neighbours'.
std::vector<float> random_f32(int rows, int cols, uint64_t seed) {
  std::vector<float> x(static_cast<std::size_t>(rows) * cols);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = std::ldexp(hash_uniform(seed, i), static_cast<int>(i / cols % 9) - 4);
  return x;
}

TEST(Fp8RowsGpu, RowQuantOfFp32WithGroupMajorScales) {
  UNIMOE_REQUIRE_GPU();
  constexpr int kRows = 37, kCols = 400, kLd = 40, kLive = 30;  // groups 128, 128, 128, 16
  const int groups = (kCols + 127) / 128;
  const std::vector<float> x = random_f32(kRows, kCols, 5);
  DeviceBuffer<float> dx(x), scales(static_cast<std::size_t>(groups) * kLd);
  DeviceBuffer<uint8_t> codes(x.size());
  DeviceBuffer<int32_t> live(std::vector<int32_t>{kLive});
  codes.poison();
  scales.poison();
  Fp8RowQuantParams p;
  p.x_f32 = dx.get();
  p.rows = kRows;
  p.cols = kCols;
  p.rows_device = live.get();
  p.codes = codes.get();
  p.scales = scales.get();
  p.scales_ld = kLd;
  launch_quantize_fp8_rows(p, nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> got_codes = codes.download();
  const std::vector<float> got_scales = scales.download();
  int bad_codes = 0, bad_scales = 0;
  for (int r = 0; r < kRows; ++r) {
    const ref::QuantMatrix want =
        ref::quantize(QuantVariant::FP8Block128, x.data() + static_cast<std::size_t>(r) * kCols, 1, kCols);
    for (int g = 0; g < groups; ++g) {
      const uint32_t got = bits_of(got_scales[static_cast<std::size_t>(g) * kLd + r]);
      bad_scales += got != (r < kLive ? bits_of(want.scales[g]) : kPoison);
    }
    for (int c = 0; c < kCols; ++c)
      bad_codes += got_codes[static_cast<std::size_t>(r) * kCols + c] != (r < kLive ? want.data[c] : 0xff);
  }
  // Entries of the scale array past the capacity (rows kRows..kLd) are never written.
  for (int g = 0; g < groups; ++g)
    for (int r = kRows; r < kLd; ++r) bad_scales += bits_of(got_scales[g * kLd + r]) != kPoison;
  EXPECT_EQ(bad_codes, 0);
  EXPECT_EQ(bad_scales, 0);
}

TEST(Fp8RowsGpu, TensorQuantOfFp32BroadcastsItsScale) {
  UNIMOE_REQUIRE_GPU();
  constexpr int kRows = 50, kCols = 256, kLd = 52, kLive = 41;
  const std::vector<float> x = random_f32(kRows, kCols, 9);
  for (const bool given : {false, true}) {
    SCOPED_TRACE(given ? "static scale" : "dynamic scale");
    const float static_value = 0.0123f;
    DeviceBuffer<float> dx(x), scale(1), scratch(quantize_fp8_tensor_scratch_floats(kRows, kCols));
    DeviceBuffer<float> row_scales(2 * kLd), static_scale(std::vector<float>{static_value});
    DeviceBuffer<uint8_t> codes(x.size());
    DeviceBuffer<int32_t> live(std::vector<int32_t>{kLive});
    codes.poison();
    row_scales.poison();
    Fp8TensorQuantParams p;
    p.x_f32 = dx.get();
    p.rows = kRows;
    p.cols = kCols;
    p.rows_device = live.get();
    p.static_scale = given ? static_scale.get() : nullptr;
    p.codes = codes.get();
    p.scale = scale.get();
    p.scratch = scratch.get();
    p.row_scales = row_scales.get();
    p.row_scales_ld = kLd;
    launch_quantize_fp8_tensor(p, nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    // The reference's rule over the live rows: dynamic amax / 448, or the static scale.
    std::vector<float> want(x.begin(), x.begin() + kLive * kCols);
    ref::quantize_activation(QuantVariant::FP8PerTensor, want.data(), kLive, kCols,
                             given ? static_value : 0.0f);
    const float s = scale.download()[0];
    if (given) EXPECT_EQ(s, static_value);
    const std::vector<uint8_t> got = codes.download();
    int bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      bad += i < want.size() ? !(ref::e4m3_to_f32(got[i]) * s == want[i]) : got[i] != 0xff;
    EXPECT_EQ(bad, 0);
    const std::vector<float> rs = row_scales.download();
    for (int g = 0; g < 2; ++g)
      for (int r = 0; r < kLd; ++r)
        EXPECT_EQ(bits_of(rs[g * kLd + r]), r < kLive ? bits_of(s) : kPoison) << g << " " << r;
  }
}

// FP8PerTensor's dynamic scale made alone (launch_fp8_tensor_scale: the
// amax pass, then one block) is the scale of the dynamic quantize kernels,
// bit for bit: bf16 and fp32 input, the live rows only (a dead row holds
// the largest magnitude), a NaN skipped, and the two-kernel size (past
// 32768 elements) as well as the one-block size.
TEST(Fp8RowsGpu, TensorScaleAloneIsTheDynamicQuantizeScale) {
  UNIMOE_REQUIRE_GPU();
  for (const int rows : {50, 300})
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE(std::to_string(rows) + " rows" + (bf16 ? " bf16" : " fp32"));
      constexpr int kCols = 256;
      const int live_rows = rows - 9;
      std::vector<float> x = random_f32(rows, kCols, 19 + rows);
      x[5 * kCols + 3] = std::nanf("");
      x[static_cast<std::size_t>(live_rows + 2) * kCols + 7] = 1.0e4f;  // dead row: not counted
      std::vector<uint16_t> xb(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) xb[i] = ref::f32_to_bf16(x[i]);
      DeviceBuffer<float> dx(x), scale1(1), scale2(1),
          scratch(quantize_fp8_tensor_scratch_floats(rows, kCols));
      DeviceBuffer<uint16_t> dxb(xb);
      DeviceBuffer<uint8_t> codes(x.size());
      DeviceBuffer<int32_t> live(std::vector<int32_t>{live_rows});
      scale1.poison();
      scale2.poison();
      Fp8TensorQuantParams p;
      if (bf16)
        p.x = dxb.get();
      else
        p.x_f32 = dx.get();
      p.rows = rows;
      p.cols = kCols;
      p.rows_device = live.get();
      p.codes = codes.get();
      p.scale = scale2.get();
      p.scratch = scratch.get();
      launch_quantize_fp8_tensor(p, nullptr);
      p.scale = scale1.get();
      launch_fp8_tensor_scale(p, nullptr);
      UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
      const float s1 = scale1.download()[0], s2 = scale2.download()[0];
      EXPECT_EQ(bits_of(s1), bits_of(s2));
      // Not the dead row's 1e4 / 448, and not the poison.
      EXPECT_LT(s1, 1.0f);
      EXPECT_GT(s1, 0.0f);
    }
  Fp8TensorQuantParams bad;
  bad.rows = 4;
  bad.cols = 128;
  EXPECT_THROW(launch_fp8_tensor_scale(bad, nullptr), std::invalid_argument);  // no scale, scratch
  EXPECT_THROW(launch_fp8_scale_from_partials(nullptr, 1, nullptr, nullptr), std::invalid_argument);
}

// The activation kernel's CTA maxima (amax_partials), reduced by
// launch_fp8_scale_from_partials, give the dynamic quantize kernel's scale
// of the activation it wrote, bit for bit, and the activation itself is
// the same with and without them: every activation, biases, live rows
// fewer than the capacity (a dead row holds the largest input), an empty
// expert, a NaN; a capacity that is not a multiple of the CTA's rows.
TEST(Fp8RowsGpu, ActivationAmaxPartialsGiveTheDynamicScale) {
  UNIMOE_REQUIRE_GPU();
  constexpr int kRows = 45, kLive = 37, kInter = 384;
  const std::vector<int32_t> offsets = {0, 11, 11, kLive};
  for (Activation act : {Activation::SwiGLU, Activation::GeGLU, Activation::SwiGLUOai,
                         Activation::ReLU2}) {
    SCOPED_TRACE("activation " + std::to_string(static_cast<int>(act)));
    const int cols = act == Activation::ReLU2 ? kInter : 2 * kInter;
    std::vector<float> h = random_f32(kRows, cols, 77);
    h[4 * cols + 9] = std::nanf("");
    h[static_cast<std::size_t>(kLive + 3) * cols + 1] = 300.0f;  // dead row: not counted
    std::vector<float> b13(3 * cols);
    for (std::size_t i = 0; i < b13.size(); ++i) b13[i] = 0.25f * hash_uniform(78, i);
    const int blocks = gated_activation_blocks(kRows);
    DeviceBuffer<float> dh(h), db(b13), act1(static_cast<std::size_t>(kRows) * kInter),
        act2(act1.size()), partials(blocks), scale1(1), scale2(1),
        scratch(quantize_fp8_tensor_scratch_floats(kRows, kInter));
    DeviceBuffer<int32_t> doff(offsets), live(std::vector<int32_t>{kLive});
    DeviceBuffer<uint8_t> codes(act1.size());
    for (auto* b : {&act1, &act2, &partials, &scale1, &scale2}) b->poison();
    GatedActivationParams a;
    a.h_f32 = dh.get();
    a.b13 = db.get();
    a.expert_offsets = doff.get();
    a.num_groups = 3;
    a.capacity = kRows;
    a.intermediate = kInter;
    a.activation = act;
    a.out_f32 = act2.get();
    launch_gated_activation(a, nullptr);
    a.out_f32 = act1.get();
    a.amax_partials = partials.get();
    launch_gated_activation(a, nullptr);
    launch_fp8_scale_from_partials(partials.get(), blocks, scale1.get(), nullptr);
    Fp8TensorQuantParams q;
    q.x_f32 = act2.get();
    q.rows = kRows;
    q.cols = kInter;
    q.rows_device = live.get();
    q.codes = codes.get();
    q.scale = scale2.get();
    q.scratch = scratch.get();
    launch_quantize_fp8_tensor(q, nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> g1 = act1.download(), g2 = act2.download();
    int same = 0;
    for (std::size_t i = 0; i < g1.size(); ++i) same += bits_of(g1[i]) == bits_of(g2[i]);
    EXPECT_EQ(same, static_cast<int>(g1.size()));
    const std::vector<float> parts = partials.download();
    int written = 0;
    for (float v : parts) written += bits_of(v) != kPoison;
    EXPECT_EQ(written, blocks);
    const float s1 = scale1.download()[0], s2 = scale2.download()[0];
    EXPECT_EQ(bits_of(s1), bits_of(s2));
    EXPECT_GT(s1, 0.0f);
  }
  GatedActivationParams bad;
  bad.intermediate = 128;
  bad.capacity = 1;
  bad.h = reinterpret_cast<const uint16_t*>(16);
  bad.expert_offsets = reinterpret_cast<const int32_t*>(16);
  bad.out = reinterpret_cast<uint16_t*>(16);
  bad.amax_partials = reinterpret_cast<float*>(16);  // with a bf16 output: refused
  EXPECT_THROW(launch_gated_activation(bad, nullptr), std::invalid_argument);
}

TEST(Fp8RowsGpu, GatherCopiesCodesAndScalesInPermutedOrder) {
  UNIMOE_REQUIRE_GPU();
  constexpr int kTokens = 9, kTopK = 3, kHidden = 384, kGroups = 3, kLdIn = 12, kLdOut = 28;
  constexpr int kCapacity = kTokens * kTopK, kLive = 20;
  std::vector<uint8_t> codes(kTokens * kHidden);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(hash64(i) & 0x7e);
  std::vector<float> scales(kGroups * kLdIn);
  for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = 1.0f + static_cast<float>(i);
  std::vector<int32_t> p2e(kCapacity);
  std::iota(p2e.begin(), p2e.end(), 0);
  for (int i = 0; i < kCapacity; ++i) std::swap(p2e[i], p2e[hash64(100 + i) % kCapacity]);
  // Two groups: 12 and 8 live rows, then the rest of the capacity unused.
  const std::vector<int32_t> offsets = {0, 12, kLive};
  DeviceBuffer<uint8_t> d_codes(codes), out_codes(static_cast<std::size_t>(kCapacity) * kHidden);
  DeviceBuffer<float> d_scales(scales), out_scales(kGroups * kLdOut);
  DeviceBuffer<int32_t> d_p2e(p2e), d_offsets(offsets);
  out_codes.poison();
  out_scales.poison();
  GatherFp8RowsParams g;
  g.codes = d_codes.get();
  g.scales = d_scales.get();
  g.scales_ld = kLdIn;
  g.permuted_to_expanded = d_p2e.get();
  g.expert_offsets = d_offsets.get();
  g.num_groups = 2;
  g.top_k = kTopK;
  g.hidden = kHidden;
  g.capacity = kCapacity;
  g.out_codes = out_codes.get();
  g.out_scales = out_scales.get();
  g.out_scales_ld = kLdOut;
  launch_gather_fp8_rows(g, nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = out_codes.download();
  const std::vector<float> got_scales = out_scales.download();
  int bad = 0;
  for (int r = 0; r < kCapacity; ++r) {
    const int t = p2e[r] / kTopK;
    for (int c = 0; c < kHidden; ++c)
      bad += got[r * kHidden + c] != (r < kLive ? codes[t * kHidden + c] : 0xff);
    for (int q = 0; q < kGroups; ++q)
      bad += bits_of(got_scales[q * kLdOut + r]) !=
             (r < kLive ? bits_of(scales[q * kLdIn + t]) : kPoison);
  }
  EXPECT_EQ(bad, 0);
  g.hidden = 200;  // not a multiple of 128
  EXPECT_THROW(launch_gather_fp8_rows(g, nullptr), std::invalid_argument);
}

TEST(Fp8RowsGpu, ActivationWritesFp32) {
  UNIMOE_REQUIRE_GPU();
  constexpr int kRows = 19, kInter = 136, kLive = 15;
  const std::vector<int32_t> offsets = {0, 4, 4, kLive};  // the middle expert is empty
  std::vector<uint16_t> h(static_cast<std::size_t>(kRows) * 2 * kInter);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = ref::f32_to_bf16(3.0f * hash_uniform(21, i));
  std::vector<float> b13(3 * 2 * kInter);
  for (std::size_t i = 0; i < b13.size(); ++i) b13[i] = 0.1f * hash_uniform(22, i);
  DeviceBuffer<uint16_t> dh(h);
  DeviceBuffer<float> db(b13), out(static_cast<std::size_t>(kRows) * kInter);
  DeviceBuffer<int32_t> doff(offsets);
  out.poison();
  GatedActivationParams p;
  p.h = dh.get();
  p.b13 = db.get();
  p.expert_offsets = doff.get();
  p.num_groups = 3;
  p.capacity = kRows;
  p.intermediate = kInter;
  p.activation = Activation::SwiGLU;
  p.out_f32 = out.get();
  launch_gated_activation(p, nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = out.download();
  double err = 0, norm = 0;
  int untouched = 0;
  for (int r = 0; r < kRows; ++r) {
    const int e = r < 4 ? 0 : 2;
    for (int j = 0; j < kInter; ++j) {
      const float v = got[static_cast<std::size_t>(r) * kInter + j];
      if (r >= kLive) {
        untouched += bits_of(v) == kPoison;
        continue;
      }
      const double g = ref::bf16_to_f32(h[r * 2 * kInter + j]) + b13[e * 2 * kInter + j];
      const double u = ref::bf16_to_f32(h[r * 2 * kInter + kInter + j]) + b13[e * 2 * kInter + kInter + j];
      const double want = ref::activate(Activation::SwiGLU, g, u, 0, 0);
      err += (v - want) * (v - want);
      norm += want * want;
    }
  }
  // fp32 math against fp64: only rounding differs, far below bf16's 4e-3.
  EXPECT_LT(std::sqrt(err / norm), 1e-6);
  EXPECT_EQ(untouched, (kRows - kLive) * kInter);
  p.out = reinterpret_cast<uint16_t*>(out.get());  // both outputs: refused
  EXPECT_THROW(launch_gated_activation(p, nullptr), std::invalid_argument);
}

// launch_gated_activation_fp8 writes the codes and scales of the fp32
// activation kernel followed by the row quantize kernel, bit for bit:
// every activation, with and without biases, I of one, three (an odd
// multiple of 128: a half-warp past the row) and sixteen 128-column groups,
// an empty expert, live rows fewer than the capacity (the rest keep the
// poison), values spread over 2^-4..2^4 by row, and a NaN (skipped by both
// amaxes, encoded as NaN by both). With a static scale (FP8PerTensor's) the
// two are the activation kernel and the tensor quantize kernel given it.
TEST(Fp8RowsGpu, ActivationQuantizedInOneKernelMatchesTheTwo) {
  UNIMOE_REQUIRE_GPU();
  constexpr int kRows = 21, kLive = 17, kLd = 24;
  const std::vector<int32_t> offsets = {0, 6, 6, kLive};  // the middle expert is empty
  for (int inter : {128, 384, 2048})
    for (Activation act : {Activation::SwiGLU, Activation::GeGLU, Activation::SwiGLUOai,
                           Activation::ReLU2})
      for (int form = 0; form < 3; ++form) {
        // 0, 1: per-row scales without and with biases; 2: a static scale
        // (FP8PerTensor's), against the tensor quantize kernel given it.
        const bool bias = form == 1;
        const bool given = form == 2;
        SCOPED_TRACE("I " + std::to_string(inter) + " activation " +
                     std::to_string(static_cast<int>(act)) + (bias ? " bias" : "") +
                     (given ? " static scale" : ""));
        const int cols = act == Activation::ReLU2 ? inter : 2 * inter;
        const int groups = inter / 128;
        std::vector<float> h = random_f32(kRows, cols, 31 + inter);
        h[3 * cols + 5] = std::nanf("");
        std::vector<float> b13(3 * cols);
        for (std::size_t i = 0; i < b13.size(); ++i) b13[i] = 0.25f * hash_uniform(32, i);
        DeviceBuffer<float> dh(h), db(b13), act_f32(static_cast<std::size_t>(kRows) * inter);
        DeviceBuffer<int32_t> doff(offsets), live(std::vector<int32_t>{kLive});
        DeviceBuffer<uint8_t> codes2(static_cast<std::size_t>(kRows) * inter), codes1(codes2.size());
        DeviceBuffer<float> scales2(static_cast<std::size_t>(groups) * kLd), scales1(scales2.size());
        DeviceBuffer<float> static_scale(std::vector<float>{0.0071f}), tensor_scale(1);
        for (auto* b : {&codes1, &codes2}) b->poison();
        for (auto* b : {&scales1, &scales2}) b->poison();

        GatedActivationParams a;
        a.h_f32 = dh.get();
        a.b13 = bias ? db.get() : nullptr;
        a.expert_offsets = doff.get();
        a.num_groups = 3;
        a.capacity = kRows;
        a.intermediate = inter;
        a.activation = act;
        a.swiglu_alpha = 1.702f;
        a.swiglu_limit = 7.0f;
        a.out_f32 = act_f32.get();
        launch_gated_activation(a, nullptr);
        if (given) {
          Fp8TensorQuantParams q;
          q.x_f32 = act_f32.get();
          q.rows = kRows;
          q.cols = inter;
          q.rows_device = live.get();
          q.static_scale = static_scale.get();
          q.codes = codes2.get();
          q.scale = tensor_scale.get();
          q.row_scales = scales2.get();
          q.row_scales_ld = kLd;
          launch_quantize_fp8_tensor(q, nullptr);
        } else {
          Fp8RowQuantParams q;
          q.x_f32 = act_f32.get();
          q.rows = kRows;
          q.cols = inter;
          q.rows_device = live.get();
          q.codes = codes2.get();
          q.scales = scales2.get();
          q.scales_ld = kLd;
          launch_quantize_fp8_rows(q, nullptr);
        }

        GatedActivationFp8Params f;
        f.h_f32 = dh.get();
        f.b13 = a.b13;
        f.expert_offsets = doff.get();
        f.num_groups = 3;
        f.capacity = kRows;
        f.intermediate = inter;
        f.activation = act;
        f.swiglu_alpha = 1.702f;
        f.swiglu_limit = 7.0f;
        f.out_codes = codes1.get();
        f.out_scales = scales1.get();
        f.out_scales_ld = kLd;
        f.static_scale = given ? static_scale.get() : nullptr;
        launch_gated_activation_fp8(f, nullptr);
        UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());

        const std::vector<uint8_t> c1 = codes1.download(), c2 = codes2.download();
        const std::vector<float> s1 = scales1.download(), s2 = scales2.download();
        EXPECT_EQ(c1, c2);
        int same = 0, poisoned = 0;
        for (std::size_t i = 0; i < s1.size(); ++i) same += bits_of(s1[i]) == bits_of(s2[i]);
        for (int r = kLive; r < kRows; ++r)
          for (int j = 0; j < inter; ++j) poisoned += c1[static_cast<std::size_t>(r) * inter + j] == 0xff;
        EXPECT_EQ(same, static_cast<int>(s1.size()));
        EXPECT_EQ(poisoned, (kRows - kLive) * inter);
        // A quarter of the codes at least are neither 0 nor the poison
        // (about half are 0 for SwiGLUOai on these inputs): a check that
        // can fail.
        EXPECT_GT(std::count_if(c1.begin(), c1.end(), [](uint8_t c) { return c != 0 && c != 0xff; }),
                  kLive * inter / 4);
      }
  GatedActivationFp8Params bad;
  bad.intermediate = 136;  // not a multiple of 128
  bad.capacity = 1;
  EXPECT_THROW(launch_gated_activation_fp8(bad, nullptr), std::invalid_argument);
}

// launch_quantize_fp8_rows_scatter writes the codes and scales of the row
// quantize kernel followed by the gather, bit for bit: 11 tokens, top 3,
// H of one and of three 128-column groups, a permutation of the live
// permuted rows (20 of the capacity 33) with off-rank entries (-1), values
// spread over 2^-4..2^4 by token and a NaN; permuted rows no token maps to
// keep the poison. With a static scale (FP8PerTensor's) the quantize kernel
// is the tensor one given it.
TEST(Fp8RowsGpu, QuantizeScatteredToPermutedRowsMatchesQuantizeThenGather) {
  UNIMOE_REQUIRE_GPU();
  constexpr int kTokens = 11, kTopK = 3, kCapacity = kTokens * kTopK, kLive = 20, kLd = 36;
  for (int hidden : {128, 384})
  for (bool given : {false, true}) {
    SCOPED_TRACE("H " + std::to_string(hidden) + (given ? " static scale" : ""));
    const int groups = hidden / 128;
    std::vector<uint16_t> x(static_cast<std::size_t>(kTokens) * hidden);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = ref::f32_to_bf16(std::ldexp(hash_uniform(41, i), static_cast<int>(i / hidden % 9) - 4));
    x[2 * hidden + 7] = 0x7fc0;  // NaN
    // Expanded rows: the first kLive of a shuffled order take permuted rows
    // 0..kLive-1, the rest are off this rank.
    std::vector<int32_t> order(kCapacity), e2p(kCapacity, -1), p2e(kCapacity, 0);
    std::iota(order.begin(), order.end(), 0);
    for (int i = 0; i < kCapacity; ++i) std::swap(order[i], order[hash64(300 + i) % kCapacity]);
    for (int r = 0; r < kLive; ++r) {
      e2p[order[r]] = r;
      p2e[r] = order[r];
    }
    const std::vector<int32_t> offsets = {0, 9, kLive};
    DeviceBuffer<uint16_t> dx(x);
    DeviceBuffer<int32_t> d_e2p(e2p), d_p2e(p2e), d_offsets(offsets);
    DeviceBuffer<uint8_t> tok_codes(x.size()), codes1(static_cast<std::size_t>(kCapacity) * hidden),
        codes2(codes1.size());
    DeviceBuffer<float> tok_scales(static_cast<std::size_t>(groups) * 12), scales1(groups * kLd),
        scales2(groups * kLd);
    DeviceBuffer<float> static_scale(std::vector<float>{0.0213f}), tensor_scale(1);
    for (auto* b : {&codes1, &codes2}) b->poison();
    for (auto* b : {&scales1, &scales2}) b->poison();

    if (given) {  // FP8PerTensor's static scale: the tensor quantize kernel given it
      Fp8TensorQuantParams q;
      q.x = dx.get();
      q.rows = kTokens;
      q.cols = hidden;
      q.static_scale = static_scale.get();
      q.codes = tok_codes.get();
      q.scale = tensor_scale.get();
      q.row_scales = tok_scales.get();
      q.row_scales_ld = 12;
      launch_quantize_fp8_tensor(q, nullptr);
    } else {
      Fp8RowQuantParams q;
      q.x = dx.get();
      q.rows = kTokens;
      q.cols = hidden;
      q.codes = tok_codes.get();
      q.scales = tok_scales.get();
      q.scales_ld = 12;
      launch_quantize_fp8_rows(q, nullptr);
    }
    GatherFp8RowsParams g;
    g.codes = tok_codes.get();
    g.scales = tok_scales.get();
    g.scales_ld = 12;
    g.permuted_to_expanded = d_p2e.get();
    g.expert_offsets = d_offsets.get();
    g.num_groups = 2;
    g.top_k = kTopK;
    g.hidden = hidden;
    g.capacity = kCapacity;
    g.out_codes = codes2.get();
    g.out_scales = scales2.get();
    g.out_scales_ld = kLd;
    launch_gather_fp8_rows(g, nullptr);

    Fp8RowScatterParams f;
    f.x = dx.get();
    f.rows = kTokens;
    f.cols = hidden;
    f.expanded_to_permuted = d_e2p.get();
    f.top_k = kTopK;
    f.capacity = kCapacity;
    f.codes = codes1.get();
    f.scales = scales1.get();
    f.scales_ld = kLd;
    f.static_scale = given ? static_scale.get() : nullptr;
    launch_quantize_fp8_rows_scatter(f, nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());

    const std::vector<uint8_t> c1 = codes1.download(), c2 = codes2.download();
    const std::vector<float> s1 = scales1.download(), s2 = scales2.download();
    EXPECT_EQ(c1, c2);
    int same = 0, live_scales = 0, poisoned = 0;
    for (std::size_t i = 0; i < s1.size(); ++i) {
      same += bits_of(s1[i]) == bits_of(s2[i]);
      live_scales += static_cast<int>(i % kLd) < kLive && bits_of(s1[i]) != kPoison;
    }
    for (std::size_t i = static_cast<std::size_t>(kLive) * hidden; i < c1.size(); ++i)
      poisoned += c1[i] == 0xff;
    EXPECT_EQ(same, static_cast<int>(s1.size()));
    EXPECT_EQ(live_scales, kLive * groups);
    EXPECT_EQ(poisoned, (kCapacity - kLive) * hidden);
  }
  Fp8RowScatterParams bad;
  bad.rows = 1;
  bad.cols = 200;  // not a multiple of 128
  EXPECT_THROW(launch_quantize_fp8_rows_scatter(bad, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace unimoe
