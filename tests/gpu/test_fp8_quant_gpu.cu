// The bf16 -> e4m3 activation quantize kernels against the CPU reference,
// bit for bit: per row the codes and the scales of ref::quantize(FP8Block128)
// on that row alone (a 1 x cols matrix, whose 128 x 128 tiles are the
// 1 x 128 groups), for the whole tensor those of ref::quantize(FP8PerTensor);
// and the dequantized codes equal ref::quantize_activation's output. Odd row
// counts, ragged groups, zeros, saturation, NaN and inf, a static scale,
// zero rows, the device row count, and a CUDA graph replayed on new inputs.
// Outputs are poisoned (0xff) before each launch; rows the kernels must not
// write are checked to still hold the poison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/hash_random.h"
#include "gpu/gpu_test_util.h"
#include "kernels/quant/fp8_quant.cuh"
#include "ref/ref.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;

constexpr int kRowCounts[] = {1, 3, 129};
constexpr int kCols[] = {16, 128, 144, 1008, 7168};
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr uint32_t kPoisonScale = 0xffffffffu;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Random bf16 [rows, cols], row r spread over [-2^(r%24-12), 2^(r%24-12)).
std::vector<uint16_t> random_bf16(int rows, int cols, uint64_t seed) {
  std::vector<uint16_t> x(static_cast<std::size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r) * cols + c;
      x[i] = ref::f32_to_bf16(std::ldexp(hash_uniform(seed, i), r % 24 - 12));
    }
  return x;
}

std::vector<float> to_f32(const std::vector<uint16_t>& x) {
  std::vector<float> f(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) f[i] = ref::bf16_to_f32(x[i]);
  return f;
}

// Counts mismatches and keeps the first one's element (or scale) index.
struct Mismatches {
  int count = 0;
  std::size_t first = 0;
  void add(bool equal, std::size_t index) {
    if (!equal && count++ == 0) first = index;
  }
};

bool same_value(float a, float b) { return bits_of(a) == bits_of(b) || (std::isnan(a) && std::isnan(b)); }

// Dequantized device codes against ref::quantize_activation over the live rows.
void expect_round_trip(QuantVariant variant, const std::vector<float>& x, int live, int cols,
                       const std::vector<uint8_t>& codes, const std::vector<float>& scales,
                       bool per_group) {
  std::vector<float> want(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(live) * cols);
  ref::quantize_activation(variant, want.data(), live, cols);
  const int groups = (cols + kFp8GroupCols - 1) / kFp8GroupCols;
  Mismatches m;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const std::size_t r = i / cols, g = (i % cols) / kFp8GroupCols;
    const float scale = per_group ? scales[r * groups + g] : scales[0];
    m.add(same_value(ref::e4m3_to_f32(codes[i]) * scale, want[i]), i);
  }
  EXPECT_EQ(m.count, 0) << "round trip, first at element " << m.first;
}

// Device outputs of the row form against the reference: rows < live exact,
// rows >= live still poisoned.
void expect_rows_match(const std::vector<uint16_t>& x_bf16, int rows, int live, int cols,
                       const std::vector<uint8_t>& codes, const std::vector<float>& scales) {
  const std::vector<float> x = to_f32(x_bf16);
  const int groups = (cols + kFp8GroupCols - 1) / kFp8GroupCols;
  Mismatches code_errors, scale_errors;
  for (int r = 0; r < rows; ++r) {
    const bool is_live = r < live;
    ref::QuantMatrix want;
    const float* row = x.data() + static_cast<std::size_t>(r) * cols;
    if (is_live) want = ref::quantize(QuantVariant::FP8Block128, row, 1, cols);
    for (int g = 0; g < groups; ++g) {
      const std::size_t i = static_cast<std::size_t>(r) * groups + g;
      scale_errors.add(bits_of(scales[i]) == (is_live ? bits_of(want.scales[g]) : kPoisonScale), i);
    }
    for (int c = 0; c < cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r) * cols + c;
      code_errors.add(codes[i] == (is_live ? want.data[c] : 0xff), i);
    }
  }
  EXPECT_EQ(scale_errors.count, 0) << "scales, first at row-major scale " << scale_errors.first;
  EXPECT_EQ(code_errors.count, 0) << "codes, first at element " << code_errors.first;
  expect_round_trip(QuantVariant::FP8Block128, x, live, cols, codes, scales, true);
}

// The tensor form: codes of rows < live and the scale exact, the rest poisoned.
void expect_tensor_matches(const std::vector<uint16_t>& x_bf16, int rows, int live, int cols,
                           const std::vector<uint8_t>& codes, float scale) {
  const std::vector<float> x = to_f32(x_bf16);
  const ref::QuantMatrix want = ref::quantize(QuantVariant::FP8PerTensor, x.data(), live, cols);
  EXPECT_EQ(bits_of(scale), bits_of(want.scales[0])) << "scale " << scale << " want " << want.scales[0];
  Mismatches m;
  const std::size_t live_count = static_cast<std::size_t>(live) * cols;
  for (std::size_t i = 0; i < static_cast<std::size_t>(rows) * cols; ++i)
    m.add(codes[i] == (i < live_count ? want.data[i] : 0xff), i);
  EXPECT_EQ(m.count, 0) << "codes, first at element " << m.first;
  expect_round_trip(QuantVariant::FP8PerTensor, x, live, cols, codes, {scale}, false);
}

// Input and outputs of one quantize launch, capacity rows x cols.
struct Rig {
  Rig(int rows, int cols)
      : rows(rows), cols(cols),
        x(static_cast<std::size_t>(rows) * cols),
        codes(static_cast<std::size_t>(rows) * cols),
        scales(static_cast<std::size_t>(rows) * ((cols + kFp8GroupCols - 1) / kFp8GroupCols)),
        scale(1),
        scratch(quantize_fp8_tensor_scratch_floats(rows, cols)),
        live(1) {}

  void poison() {
    codes.poison();
    scales.poison();
    scale.poison();
    scratch.poison();
  }
  Fp8RowQuantParams row_params(bool device_rows) const {
    Fp8RowQuantParams p;
    p.x = x.get();
    p.rows = rows;
    p.cols = cols;
    p.rows_device = device_rows ? live.get() : nullptr;
    p.codes = codes.get();
    p.scales = scales.get();
    return p;
  }
  Fp8TensorQuantParams tensor_params(bool device_rows, const float* static_scale = nullptr) const {
    Fp8TensorQuantParams p;
    p.x = x.get();
    p.rows = rows;
    p.cols = cols;
    p.rows_device = device_rows ? live.get() : nullptr;
    p.static_scale = static_scale;
    p.codes = codes.get();
    p.scale = scale.get();
    p.scratch = static_scale ? nullptr : scratch.get();
    return p;
  }
  void run_rows(const std::vector<uint16_t>& host_x) {
    x.upload(host_x);
    poison();
    launch_quantize_fp8_rows(row_params(false), nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    expect_rows_match(host_x, rows, rows, cols, codes.download(), scales.download());
  }
  void run_tensor(const std::vector<uint16_t>& host_x) {
    x.upload(host_x);
    poison();
    launch_quantize_fp8_tensor(tensor_params(false), nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    expect_tensor_matches(host_x, rows, rows, cols, codes.download(), scale.download()[0]);
  }

  int rows, cols;
  DeviceBuffer<uint16_t> x;
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales, scale, scratch;
  DeviceBuffer<int32_t> live;
};

// Six rows of 3 groups: zeros and -0; a huge value, NaN and -NaN, bf16
// subnormals (whose scale is an fp32 subnormal); +inf, -inf, inf with NaN;
// amax 448 (scale 1) with bf16 values, many on e4m3 ties; all NaN; amax
// 1e-38, whose scale is an fp32 subnormal too.
std::vector<uint16_t> special_rows() {
  constexpr int kCols3 = 3 * kFp8GroupCols;
  std::vector<float> v(6 * kCols3);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = hash_uniform(17, i);
  auto at = [&](int r, int c) -> float& { return v[static_cast<std::size_t>(r) * kCols3 + c]; };
  for (int c = 0; c < kCols3; ++c) at(0, c) = c < 2 * kFp8GroupCols ? 0.0f : -0.0f;
  at(1, 5) = 3.0e38f;
  at(1, 130) = kNan;
  at(1, 131) = -kNan;
  for (int c = 256; c < kCols3; ++c) at(1, c) = (c % 2 ? -1.0f : 1.0f) * std::ldexp(c % 7, -133);
  at(2, 7) = kInf;
  at(2, 200) = -kInf;
  at(2, 300) = kInf;
  at(2, 301) = kNan;
  for (int c = 0; c < kCols3; ++c) at(3, c) *= 448.0f;
  at(3, 0) = 448.0f;
  at(3, 128) = -448.0f;
  at(3, 256) = 448.0f;
  for (int c = 0; c < kCols3; ++c) at(4, c) = kNan;
  for (int c = 0; c < kCols3; ++c) at(5, c) *= 1.0e-38f;
  at(5, 0) = 1.0e-38f;
  std::vector<uint16_t> x(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) x[i] = ref::f32_to_bf16(v[i]);
  return x;
}

TEST(Fp8QuantGpu, RowsMatchReference) {
  UNIMOE_REQUIRE_GPU();
  for (const int rows : kRowCounts)
    for (const int cols : kCols) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
      Rig rig(rows, cols);
      rig.run_rows(random_bf16(rows, cols, 1000 + rows * 7 + cols));
    }
}

TEST(Fp8QuantGpu, RowsSpecialValues) {
  UNIMOE_REQUIRE_GPU();
  Rig rig(6, 3 * kFp8GroupCols);
  rig.run_rows(special_rows());
  // Pinned where the reference is explicit: zeros give scale 1 and codes
  // 0 / 0x80; an all-NaN group gives scale 1 and 0x7f; inf makes the scale inf.
  const std::vector<float> scales = rig.scales.download();
  const std::vector<uint8_t> codes = rig.codes.download();
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_EQ(codes[0], 0x00);
  EXPECT_EQ(codes[2 * kFp8GroupCols], 0x80);
  EXPECT_EQ(codes[1 * 384 + 5], 0x7e);                // the huge value lands on 448
  EXPECT_EQ(codes[1 * 384 + 130], 0x7f);              // NaN
  EXPECT_EQ(codes[1 * 384 + 131], 0x7f);              // -NaN
  EXPECT_EQ(scales[2 * 3], kInf);
  EXPECT_EQ(scales[4 * 3], 1.0f);
  EXPECT_EQ(codes[4 * 384], 0x7f);
}

TEST(Fp8QuantGpu, ZeroRowsAndBadShapes) {
  UNIMOE_REQUIRE_GPU();
  Rig rig(2, 128);
  rig.poison();
  Fp8RowQuantParams rows = rig.row_params(false);
  rows.rows = 0;
  launch_quantize_fp8_rows(rows, nullptr);  // launches nothing
  Fp8RowQuantParams null_rows;
  null_rows.cols = 16;
  launch_quantize_fp8_rows(null_rows, nullptr);
  Fp8TensorQuantParams tensor = rig.tensor_params(false);
  tensor.rows = 0;
  launch_quantize_fp8_tensor(tensor, nullptr);  // writes only the scale, 1
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  for (const uint8_t c : rig.codes.download()) ASSERT_EQ(c, 0xff);
  for (const float s : rig.scales.download()) ASSERT_EQ(bits_of(s), kPoisonScale);
  EXPECT_EQ(rig.scale.download()[0], 1.0f);

  for (const int bad_cols : {0, 8, 24, -16}) {
    Fp8RowQuantParams p = rig.row_params(false);
    p.cols = bad_cols;
    EXPECT_THROW(launch_quantize_fp8_rows(p, nullptr), std::invalid_argument) << bad_cols;
    Fp8TensorQuantParams t = rig.tensor_params(false);
    t.cols = bad_cols;
    EXPECT_THROW(launch_quantize_fp8_tensor(t, nullptr), std::invalid_argument) << bad_cols;
  }
}

TEST(Fp8QuantGpu, StopAtTheDeviceRowCount) {
  UNIMOE_REQUIRE_GPU();
  constexpr int kRows = 129, kCols1008 = 1008;
  Rig rig(kRows, kCols1008);
  std::vector<uint16_t> x = random_bf16(kRows, kCols1008, 77);
  x[static_cast<std::size_t>(100) * kCols1008 + 3] = ref::f32_to_bf16(1.0e6f);  // past most live counts
  rig.x.upload(x);
  for (const int live : {0, 1, 50, 128, 129, 500, -3}) {
    SCOPED_TRACE("live rows " + std::to_string(live));
    const int clamped = std::max(0, std::min(live, kRows));
    rig.live.upload({live});
    rig.poison();
    launch_quantize_fp8_rows(rig.row_params(true), nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    expect_rows_match(x, kRows, clamped, kCols1008, rig.codes.download(), rig.scales.download());
    rig.poison();
    launch_quantize_fp8_tensor(rig.tensor_params(true), nullptr);  // amax over the live rows only
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    expect_tensor_matches(x, kRows, clamped, kCols1008, rig.codes.download(), rig.scale.download()[0]);
  }
}

TEST(Fp8QuantGpu, TensorMatchesReference) {
  UNIMOE_REQUIRE_GPU();
  for (const int rows : kRowCounts)
    for (const int cols : kCols) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
      Rig rig(rows, cols);
      rig.run_tensor(random_bf16(rows, cols, 2000 + rows * 7 + cols));
    }
  // More elements than the partial maxima's blocks cover in one step, the
  // amax in one element far from the start, a NaN elsewhere.
  constexpr int kRows = 2048, kCols7168 = 7168;
  Rig rig(kRows, kCols7168);
  std::vector<uint16_t> x = random_bf16(kRows, kCols7168, 3);
  x[static_cast<std::size_t>(1777) * kCols7168 + 4321] = ref::f32_to_bf16(-5000.0f);
  x[static_cast<std::size_t>(5) * kCols7168 + 9] = ref::f32_to_bf16(kNan);
  rig.run_tensor(x);
  EXPECT_EQ(rig.scale.download()[0], ref::round_bf16(5000.0f) / 448.0f);
}

// Dynamic scales at the one-block kernel's bound (32768 elements of
// capacity) and just past it (the two-kernel form): the amax in the last
// live element, a device row count, and the scale broadcast to every (live
// row, group) of the row scales, in the GEMMs' group-major layout.
TEST(Fp8QuantGpu, TensorAtTheOneBlockBound) {
  UNIMOE_REQUIRE_GPU();
  struct Shape {
    int rows, cols;
  };
  for (const Shape shape : {Shape{256, 128}, Shape{1, 32768}, Shape{2049, 16}, Shape{1, 32784},
                            Shape{8, 272}}) {
    for (const int live : {shape.rows, shape.rows / 2 + 1}) {
      SCOPED_TRACE("rows " + std::to_string(shape.rows) + " cols " + std::to_string(shape.cols) +
                   " live " + std::to_string(live));
      Rig rig(shape.rows, shape.cols);
      std::vector<uint16_t> x = random_bf16(shape.rows, shape.cols, 77 + shape.cols);
      x[static_cast<std::size_t>(live) * shape.cols - 1] = ref::f32_to_bf16(-3000.0f);  // past every random value (2^11)
      rig.x.upload(x);
      rig.live.upload({live});
      rig.poison();
      const int groups = (shape.cols + kFp8GroupCols - 1) / kFp8GroupCols;
      const int ld = shape.rows + 3;
      DeviceBuffer<float> row_scales(static_cast<std::size_t>(groups) * ld);
      row_scales.poison();
      Fp8TensorQuantParams p = rig.tensor_params(true);
      p.row_scales = row_scales.get();
      p.row_scales_ld = ld;
      launch_quantize_fp8_tensor(p, nullptr);
      UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
      const float scale = rig.scale.download()[0];
      EXPECT_EQ(scale, ref::round_bf16(3000.0f) / 448.0f);
      expect_tensor_matches(x, shape.rows, live, shape.cols, rig.codes.download(), scale);
      const std::vector<float> got = row_scales.download();
      int wrong = 0;
      for (int g = 0; g < groups; ++g)
        for (int r = 0; r < ld; ++r) {
          const float v = got[static_cast<std::size_t>(g) * ld + r];
          wrong += r < live ? bits_of(v) != bits_of(scale) : bits_of(v) != kPoisonScale;
        }
      EXPECT_EQ(wrong, 0) << "row scales: the live rows' entries hold the scale, the rest stay poisoned";
    }
  }
}

TEST(Fp8QuantGpu, TensorSpecialValues) {
  UNIMOE_REQUIRE_GPU();
  Rig rig(6, 3 * kFp8GroupCols);
  rig.run_tensor(special_rows());  // holds inf: scale inf, finite codes +-0, inf codes NaN
  EXPECT_EQ(rig.scale.download()[0], kInf);
  rig.run_tensor(std::vector<uint16_t>(rig.x.size(), 0));
  EXPECT_EQ(rig.scale.download()[0], 1.0f);
  rig.run_tensor(std::vector<uint16_t>(rig.x.size(), ref::f32_to_bf16(kNan)));
  EXPECT_EQ(rig.scale.download()[0], 1.0f);
  for (const uint8_t c : rig.codes.download()) ASSERT_EQ(c, 0x7f);
}

TEST(Fp8QuantGpu, TensorStaticScale) {
  UNIMOE_REQUIRE_GPU();
  constexpr int kRows = 3, kColsRagged = 144;
  constexpr float kScale = 0.25f;  // values up to 200 give 800: saturate to 448
  Rig rig(kRows, kColsRagged);
  std::vector<uint16_t> x = random_bf16(kRows, kColsRagged, 5);
  for (uint16_t& v : x) v = ref::f32_to_bf16(ref::bf16_to_f32(v) * 200.0f * (1 << 12));
  x[10] = ref::f32_to_bf16(kNan);
  x[11] = ref::f32_to_bf16(-kInf);
  rig.x.upload(x);
  DeviceBuffer<float> static_scale(std::vector<float>{kScale});
  rig.poison();
  launch_quantize_fp8_tensor(rig.tensor_params(false, static_scale.get()), nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(rig.scale.download()[0], kScale);
  const std::vector<uint8_t> codes = rig.codes.download();
  Mismatches m;
  int saturated = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const uint8_t want = ref::f32_to_e4m3(ref::bf16_to_f32(x[i]) / kScale);  // the reference's element rule
    m.add(codes[i] == want, i);
    saturated += (want & 0x7f) == 0x7e;
  }
  EXPECT_EQ(m.count, 0) << "codes, first at element " << m.first;
  EXPECT_GT(saturated, 10);
}

TEST(Fp8QuantGpu, GraphReplaysWithNewInputsAndRowCounts) {
  UNIMOE_REQUIRE_GPU();
  constexpr int kRows = 129, kCols1008 = 1008;
  Rig row_rig(kRows, kCols1008), tensor_rig(kRows, kCols1008);
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  graph = test::capture(stream, cudaStreamCaptureModeThreadLocal, [&] {
    launch_quantize_fp8_rows(row_rig.row_params(true), stream);
    launch_quantize_fp8_tensor(tensor_rig.tensor_params(true), stream);
  });
  UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const int live_counts[] = {129, 40, 1, 0, 77};
  for (int replay = 0; replay < 5; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    const int live = live_counts[replay];
    const std::vector<uint16_t> x = random_bf16(kRows, kCols1008, 500 + replay);
    for (Rig* rig : {&row_rig, &tensor_rig}) {
      rig->x.upload(x);
      rig->live.upload({live});
      rig->poison();
    }
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    expect_rows_match(x, kRows, live, kCols1008, row_rig.codes.download(), row_rig.scales.download());
    expect_tensor_matches(x, kRows, live, kCols1008, tensor_rig.codes.download(),
                          tensor_rig.scale.download()[0]);
  }
  UNIMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  UNIMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  UNIMOE_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace unimoe
