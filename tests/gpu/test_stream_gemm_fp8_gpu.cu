// The FP8Block128 stream GEMM (kernels/gemm/stream_gemm_fp8.cuh) against a
// double-precision host loop of its contract: per 128-wide K block the exact
// dot product of the e4m3 values, times a_scale * b_scale, summed over the
// blocks, plus bias, then ref::activate.
//
// Metrics, over the rows the schedule covers:
//   - random data (every finite e4m3 code, 0x7f / 0xff excluded; positive
//     scales that put pre-activations around +-2): relative L2 error
//     < 1e-5 for fp32 output, where only the order and rounding of fp32
//     additions differ (on sm_90a the e4m3 mma runs as exact conversions to
//     f16 and HMMA with fp32 accumulation: exact products), and < 1e-2 for
//     bf16 output, which rounds each value once (up to 2^-9 relative).
//     Each case prints its error.
//   - integer data (codes of -4..4, power-of-two scales): every block sum
//     is an integer below 2^11 and every scaled partial sum a multiple of
//     1/2 below 2^21, all exact in fp32 in any order, so Identity outputs
//     must equal the reference bit for bit (fp32), or its bf16 rounding
//     (bf16). This pins every index and scale exactly.
// The FP8 wgmma kernel's fp32 outputs: < 1e-3 (kF32WgmmaBound says why);
// its integer data is exact as above. NaN anywhere fails. Outputs are poisoned (0xff bytes, NaN in fp32 and
// bf16) before each launch; rows no tile covers (gaps between experts, rows
// past the last expert) must still hold the poison.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "kernels/gemm/sm90_fp8_wgmma_gemm.cuh"
#include "kernels/gemm/stream_gemm_fp8.cuh"
#include "kernels/gemm/stream_gemm_fp8_config.h"
#include "ref/ref.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;

constexpr double kF32Bound = 1e-5;
// Hopper's e4m3 wgmma adds a K block's products with fewer mantissa bits
// than fp32 (DeepSeek-V3's report: about 14), which is why both FP8
// kernels promote every 128-wide block; its fp32 outputs get this bound.
constexpr double kF32WgmmaBound = 1e-3;
constexpr double kBf16Bound = 1e-2;
constexpr int kBlock = 128;
constexpr int kTopK = 4;
constexpr float kAlpha = 1.702f, kLimit = 7.0f;

enum Flags : unsigned { kBias = 1, kGather = 2, kBf16 = 4, kInteger = 8, kPdl = 16 };

struct Shape {
  Shape(std::vector<int> rows, int k_, int n, GemmEpilogue e, unsigned flags = 0)
      : counts(std::move(rows)), k(k_), n_out(n), epilogue(e), bias(flags & kBias),
        gather(flags & kGather), f32_out(!(flags & kBf16)), integer_data(flags & kInteger),
        pdl_hooks(flags & kPdl) {}

  std::vector<int> counts;  // rows per local expert
  int k, n_out;
  GemmEpilogue epilogue;
  bool bias, gather;          // gather: GEMM1, A holds token rows read through the permutation
  bool f32_out, integer_data;
  bool pdl_hooks;             // early_dependents and prefetch_before_wait
  int spare_tiles = 3;        // max_tiles past the schedule's tiles
  int out_rows = 0;           // output capacity at least this (graph replays share buffers)
  bool wgmma = false;         // the FP8 wgmma kernel over 128-row tiles, not the stream kernel

  Shape& on_wgmma() {
    wgmma = true;
    return *this;
  }
  Shape& spare(int n) {
    spare_tiles = n;
    return *this;
  }
  int tile_m() const { return wgmma ? kFp8WgmmaTileM : 16; }

  bool gated() const { return is_gated(epilogue); }
  int b_rows() const { return gated() ? 2 * n_out : n_out; }
  std::string label() const {
    std::string c;
    for (int n : counts) c += (c.empty() ? "" : ",") + std::to_string(n);
    return "counts {" + c + "} k " + std::to_string(k) + " n_out " + std::to_string(n_out) +
           " epilogue " + std::to_string(static_cast<int>(epilogue)) + (bias ? " bias" : "") +
           (gather ? " gather" : "") + (f32_out ? " f32" : " bf16") +
           (integer_data ? " integer" : "") + (wgmma ? " wgmma" : "");
  }
};

struct Problem {
  Shape s;
  ref::Permutation perm;          // expert_offsets leave gaps between experts
  std::vector<ref::Tile> tiles;
  int rows = 0;                   // A rows = output rows (capacity)
  int a_ld = 0;                   // a_scales_ld > rows
  std::vector<uint8_t> a, b;      // [rows, k], [E, b_rows, k]
  // a_scales [k/128, a_ld], b_scales [E, ceil(b_rows/128), k/128], bias [E, b_rows]
  std::vector<float> a_scales, b_scales, bias;
};

double e4m3(uint8_t code) {
  static const std::array<double, 256> values = [] {
    std::array<double, 256> v{};
    for (int c = 0; c < 256; ++c) v[c] = ref::e4m3_to_f32(static_cast<uint8_t>(c));
    return v;
  }();
  return values[code];
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The rms of the finite e4m3 values, each code equally likely.
double code_rms() {
  double sq = 0;
  int n = 0;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) {
      sq += e4m3(static_cast<uint8_t>(c)) * e4m3(static_cast<uint8_t>(c));
      ++n;
    }
  return std::sqrt(sq / n);
}

Problem make_problem(const Shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Problem P{s};
  const int experts = static_cast<int>(s.counts.size());
  P.perm.expert_counts = s.counts;
  P.perm.expert_offsets.assign(1, 0);
  for (int e = 0; e < experts; ++e) {
    const int gap = rng() % 3 == 0 ? 1 + static_cast<int>(rng() % 3) : 0;  // rows no tile covers
    P.perm.expert_offsets.push_back(P.perm.expert_offsets.back() + s.counts[e] + gap);
  }
  P.rows = std::max(P.perm.expert_offsets.back() + 2, s.out_rows);
  P.a_ld = P.rows + 5;
  for (int p = 0; p < P.rows; ++p)
    P.perm.permuted_to_expanded.push_back(static_cast<int32_t>(rng() % (P.rows * kTopK)));
  P.tiles = ref::make_tiles(P.perm, s.tile_m());

  const int kb = s.k / kBlock, rbs = (s.b_rows() + kBlock - 1) / kBlock;
  auto code = [&]() -> uint8_t {
    if (s.integer_data)
      return ref::f32_to_e4m3(static_cast<float>(static_cast<int>(rng() % 9) - 4));
    uint8_t c;
    do c = static_cast<uint8_t>(rng()); while ((c & 0x7f) == 0x7f);
    return c;
  };
  std::uniform_real_distribution<double> spread(0.5, 2.0);
  const double rms = code_rms();
  auto scale = [&](double base, int power_offset) {
    if (s.integer_data) return std::ldexp(1.0f, static_cast<int>(rng() % 3) + power_offset);
    return static_cast<float>(base * spread(rng));
  };
  P.a.resize(static_cast<size_t>(P.rows) * s.k);
  for (auto& v : P.a) v = code();
  P.b.resize(static_cast<size_t>(experts) * s.b_rows() * s.k);
  for (auto& v : P.b) v = code();
  P.a_scales.resize(static_cast<size_t>(kb) * P.a_ld);
  for (auto& v : P.a_scales) v = scale(1.0 / rms, -1);                       // 1/2, 1, 2
  P.b_scales.resize(static_cast<size_t>(experts) * rbs * kb);
  for (auto& v : P.b_scales) v = scale(2.0 / (rms * std::sqrt(s.k)), 0);   // 1, 2, 4
  if (s.bias) {
    std::uniform_real_distribution<float> b(-2.0f, 2.0f);
    P.bias.resize(static_cast<size_t>(experts) * s.b_rows());
    for (auto& v : P.bias) v = b(rng);
  }
  return P;
}

// One pre-activation value: row p of the output (source A row src), B row brow of expert e.
double pre_activation(const Problem& P, int src, int e, int brow) {
  const Shape& s = P.s;
  const int kb_count = s.k / kBlock, rbs = (s.b_rows() + kBlock - 1) / kBlock;
  const uint8_t* x = P.a.data() + static_cast<size_t>(src) * s.k;
  const uint8_t* w = P.b.data() + (static_cast<size_t>(e) * s.b_rows() + brow) * s.k;
  double sum = 0;
  for (int kb = 0; kb < kb_count; ++kb) {
    double block = 0;
    for (int k = kb * kBlock; k < (kb + 1) * kBlock; ++k) block += e4m3(x[k]) * e4m3(w[k]);
    sum += static_cast<double>(P.a_scales[static_cast<size_t>(kb) * P.a_ld + src]) *
           P.b_scales[(static_cast<size_t>(e) * rbs + brow / kBlock) * kb_count + kb] * block;
  }
  return sum + (s.bias ? P.bias[static_cast<size_t>(e) * s.b_rows() + brow] : 0.0);
}

Activation activation_of(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::SwiGLU: return Activation::SwiGLU;
    case GemmEpilogue::GeGLU: return Activation::GeGLU;
    case GemmEpilogue::SwiGLUOai: return Activation::SwiGLUOai;
    default: return Activation::ReLU2;
  }
}

// want[p * n_out + n] for the rows of tiles [0, num_tiles); covered[p] marks them.
std::vector<double> reference(const Problem& P, int num_tiles, std::vector<bool>* covered) {
  const Shape& s = P.s;
  std::vector<double> want(static_cast<size_t>(P.rows) * s.n_out, 0.0);
  covered->assign(P.rows, false);
  for (int ti = 0; ti < num_tiles; ++ti) {
    const ref::Tile& tile = P.tiles[ti];
    for (int p = tile.row_start; p < tile.row_start + tile.rows; ++p) {
      (*covered)[p] = true;
      const int src = s.gather ? P.perm.permuted_to_expanded[p] / kTopK : p;
      for (int n = 0; n < s.n_out; ++n) {
        const double g = pre_activation(P, src, tile.expert, n);
        double v = g;
        if (s.gated())
          v = ref::activate(activation_of(s.epilogue), g,
                            pre_activation(P, src, tile.expert, s.n_out + n), kAlpha, kLimit);
        else if (s.epilogue == GemmEpilogue::ReLU2)
          v = ref::activate(Activation::ReLU2, g, 0.0, kAlpha, kLimit);
        want[static_cast<size_t>(p) * s.n_out + n] = v;
      }
    }
  }
  return want;
}

// The problem's buffers on the device, the schedule padded to max_tiles with poison.
struct DeviceProblem {
  explicit DeviceProblem(const Problem& P)
      : a(P.a), b(P.b), a_scales(P.a_scales), b_scales(P.b_scales), bias(P.bias),
        gather(P.perm.permuted_to_expanded),
        tiles(P.tiles.size() + P.s.spare_tiles), count(1),
        out_f32(P.s.f32_out ? static_cast<size_t>(P.rows) * P.s.n_out : 0),
        out_bf16(P.s.f32_out ? 0 : static_cast<size_t>(P.rows) * P.s.n_out) {
    upload(P);
  }

  // New data of the same sizes (graph replays), outputs poisoned.
  void upload(const Problem& P) {
    a.upload(P.a);
    b.upload(P.b);
    a_scales.upload(P.a_scales);
    b_scales.upload(P.b_scales);
    if (!P.bias.empty()) bias.upload(P.bias);
    gather.upload(P.perm.permuted_to_expanded);
    std::vector<DeviceTile> t;
    for (const ref::Tile& x : P.tiles) t.push_back(DeviceTile{x.expert, x.row_start, x.rows, 0});
    ASSERT_LE(t.size(), tiles.size());
    tiles.poison();  // entries past the count must never be read
    tiles.upload(t);
    count.upload({static_cast<int32_t>(t.size())});
    out_f32.poison();
    out_bf16.poison();
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());  // the memsets are asynchronous
  }

  Fp8StreamGemmParams params(const Problem& P) const {
    Fp8StreamGemmParams p;
    p.a = a.get();
    p.a_scales = a_scales.get();
    p.a_scales_ld = P.a_ld;
    p.gather = P.s.gather ? gather.get() : nullptr;
    p.top_k = kTopK;
    p.b = b.get();
    p.b_scales = b_scales.get();
    p.bias = P.s.bias ? bias.get() : nullptr;
    p.b_rows = P.s.b_rows();
    p.k = P.s.k;
    p.n_out = P.s.n_out;
    p.up_offset = P.s.gated() ? P.s.n_out : 0;
    p.epilogue = P.s.epilogue;
    p.alpha = kAlpha;
    p.limit = kLimit;
    p.tiles = tiles.get();
    p.num_tiles = count.get();
    p.max_tiles = static_cast<int>(tiles.size());
    p.out_f32 = out_f32.get();
    p.out_bf16 = out_bf16.get();
    p.early_dependents = p.prefetch_before_wait = P.s.pdl_hooks;
    return p;
  }

  DeviceBuffer<uint8_t> a, b;
  DeviceBuffer<float> a_scales, b_scales, bias;
  DeviceBuffer<int32_t> gather;
  DeviceBuffer<DeviceTile> tiles;
  DeviceBuffer<int32_t> count;
  DeviceBuffer<float> out_f32;
  DeviceBuffer<uint16_t> out_bf16;
};

// The device output against the reference (metrics of the header comment).
void check(const Problem& P, const DeviceProblem& dev) {
  const Shape& s = P.s;
  std::vector<bool> covered;
  const std::vector<double> want = reference(P, static_cast<int>(P.tiles.size()), &covered);
  const std::vector<float> f32 = dev.out_f32.download();
  const std::vector<uint16_t> bf16 = dev.out_bf16.download();
  std::vector<float> got_live, want_live;
  int poison_lost = 0, inexact = 0;
  const bool exact = s.integer_data && !s.bias && s.epilogue == GemmEpilogue::Identity;
  for (int p = 0; p < P.rows; ++p)
    for (int n = 0; n < s.n_out; ++n) {
      const size_t i = static_cast<size_t>(p) * s.n_out + n;
      const bool poisoned = s.f32_out ? bits_of(f32[i]) == 0xffffffffu : bf16[i] == 0xffff;
      if (!covered[p]) {
        poison_lost += !poisoned;
        continue;
      }
      const float got = s.f32_out ? f32[i] : ref::bf16_to_f32(bf16[i]);
      const float w = static_cast<float>(want[i]);
      got_live.push_back(got);
      want_live.push_back(w);
      if (exact && (s.f32_out ? got != w : bf16[i] != ref::f32_to_bf16(w)) && ++inexact <= 5)
        ADD_FAILURE() << "row " << p << " column " << n << ": device " << got << ", exact "
                      << want[i];
    }
  EXPECT_EQ(poison_lost, 0) << "values written to rows no tile covers";
  EXPECT_EQ(inexact, 0) << "integer data must give exact results";
  const double err = test::rel_l2(got_live, want_live);
  const double bound = s.f32_out ? (s.wgmma ? kF32WgmmaBound : kF32Bound) : kBf16Bound;
  EXPECT_LT(err, bound) << "relative L2 error (NaN gives inf)";
  std::printf("[ fp8 %s ] %s: relative L2 error %.3g (bound %.0e)\n", s.wgmma ? "wgmma" : "stream",
              s.label().c_str(), err, bound);
}

// The kernel the shape names.
void launch(const Shape& s, const Fp8StreamGemmParams& p, cudaStream_t stream) {
  if (s.wgmma)
    launch_fp8_wgmma_gemm(p, stream);
  else
    launch_fp8_stream_gemm(p, stream);
}

void run_case(const Shape& s) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(s.label() + " seed " + std::to_string(seed));
  const Problem P = make_problem(s, seed);
  DeviceProblem dev(P);
  launch(s, dev.params(P), nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  check(P, dev);
}

std::vector<int> ones(int n) { return std::vector<int>(n, 1); }
constexpr GemmEpilogue kIdentity = GemmEpilogue::Identity, kSwiGLU = GemmEpilogue::SwiGLU,
                       kGeGLU = GemmEpilogue::GeGLU, kOai = GemmEpilogue::SwiGLUOai,
                       kReLU2 = GemmEpilogue::ReLU2;

// The launch rule of stream_gemm_fp8_config.h for the shapes below (132 SMs).
TEST(Fp8StreamGemm, ConfigRule) {
  struct Want { int k, n_out; bool gated; int max_tiles, splits, unit_lanes, slots; };
  const Want cases[] = {
      {7168, 256, true, 11, 8, 32, 1},  // dsv3-tp8 GEMM1 at T = 1: 8 splits, 512-byte pieces
      {256, 7168, false, 11, 1, 16, 4}, // its GEMM2: whole rows of 256 in 16-lane units
      {128, 176, false, 6, 1, 8, 2},    {384, 176, true, 6, 1, 8, 2},
      {768, 176, false, 6, 1, 16, 4},   {1280, 176, true, 6, 2, 16, 2},
      {4352, 176, true, 6, 8, 32, 1},   // 8 splits, K not a multiple of 512: a ragged piece
      {2048, 176, true, 11, 4, 32, 2},  {512, 16, false, 4, 1, 16, 4},
  };
  for (const Want& w : cases) {
    const Fp8StreamConfig c = fp8_stream_config(w.k, w.n_out, w.gated, w.max_tiles, 132);
    EXPECT_EQ(c.splits, w.splits) << w.k << ": " << c.to_string();
    EXPECT_EQ(c.unit_lanes, w.unit_lanes) << w.k << ": " << c.to_string();
    EXPECT_EQ(c.slots, w.slots) << w.k << ": " << c.to_string();
    EXPECT_EQ(c.k_chunk % 128, 0);
    EXPECT_GE(c.k_chunk * c.splits, w.k);
    EXPECT_EQ(c.cols_per_cta, 8 / c.splits * (w.gated ? 8 : 16));
    EXPECT_EQ(c.parts, 1) << c.to_string();
  }
  // Wide CTAs: 1 split, 16-lane units, more than one wave of 2 x 132 CTAs
  // that half as many fit: dsv3-tp8's GEMM2 at T = 1 (8 x 56 = 448 -> 224),
  // a ragged last block (6928 columns: 8 x 55 -> 8 x 28), gated (64
  // columns a block: 8 x 64 -> 256). Not where the wide grid is still over
  // a wave (11 tiles: 11 x 28 = 308), nor at 8 splits, nor when asked not to.
  struct Wide { int k, n_out; bool gated; int max_tiles, parts, n_blocks; };
  const Wide wide[] = {{256, 7168, false, 8, 2, 28}, {256, 6928, false, 8, 2, 28},
                       {256, 4096, true, 8, 2, 32},  {256, 7168, false, 11, 1, 56},
                       {7168, 4096, true, 8, 1, 512}, {256, 7168, false, 1, 1, 56}};
  for (const Wide& w : wide) {
    const Fp8StreamConfig c = fp8_stream_config(w.k, w.n_out, w.gated, w.max_tiles, 132);
    EXPECT_EQ(c.parts, w.parts) << c.to_string();
    EXPECT_EQ(c.n_blocks, w.n_blocks) << c.to_string();
    if (c.parts == 2) EXPECT_EQ(c.slots, 8) << c.to_string();
    if (c.parts == 2) EXPECT_EQ(fp8_stream_config(w.k, w.n_out, w.gated, w.max_tiles, 132, false).parts, 1);
  }
}

// T = 1, top_k = 8: every tile one row (the one-token path). The dsv3-tp8
// decode shapes, then every unit width (ConfigRule: k 128 and 384 take 8
// lanes; 256, 768, 1280 16; 4352 32 with a ragged last piece).
TEST(Fp8StreamGemm, OneTokenTiles) {
  UNIMOE_REQUIRE_GPU();
  run_case(Shape(ones(8), 7168, 256, kSwiGLU, kBias | kGather | kPdl));
  run_case(Shape(ones(8), 256, 7168, kIdentity, kBf16 | kPdl));
  const GemmEpilogue epilogues[] = {kReLU2, kOai, kGeGLU};
  int i = 0;
  for (int k : {128, 384, 256, 768, 1280, 4352}) {
    const GemmEpilogue e = epilogues[i++ % 3];
    run_case(Shape({1, 0, 1, 1}, k, 176, e, is_gated(e) ? kBias | kGather : 0));
  }
}

// Wide CTAs (two column blocks a CTA, 8 slots; ConfigRule): the dsv3-tp8
// GEMM2 at T = 1, a ragged last block, gated, and tiles of 2 and 3 rows
// that a wide CTA serves one row at a time.
TEST(Fp8StreamGemm, WideCtas) {
  UNIMOE_REQUIRE_GPU();
  run_case(Shape(ones(8), 256, 7168, kIdentity, kBf16 | kPdl).spare(0));
  run_case(Shape(ones(8), 256, 6928, kIdentity, kBias).spare(0));
  run_case(Shape(ones(8), 256, 4096, kSwiGLU, kBias | kGather).spare(0));
  run_case(Shape({2, 0, 1, 3, 1, 1, 0, 1}, 256, 7168, kIdentity, kBf16).spare(2));
  run_case(Shape({1, 2, 1, 1, 0, 1, 1}, 256, 4096, kOai, kBias | kGather | kPdl).spare(1));
  for (const std::vector<int>& counts : {ones(8), std::vector<int>{2, 1, 1, 1, 1, 1, 1, 0}})
    run_case(Shape(counts, 256, 7168, kIdentity, kInteger | kBf16).spare(0));
}

// Tiles of 2, 5 and 16 rows, 21 rows (16 + 5), a one-row tile among them,
// empty experts; K in 1, 2 and 4 splits; gate and up rows in different
// 128-row scale blocks (n_out 176).
TEST(Fp8StreamGemm, MultiRowTilesAndEmptyExperts) {
  UNIMOE_REQUIRE_GPU();
  for (int k : {128, 256, 1024, 2048})
    run_case(Shape({2, 5, 16, 0, 21, 1, 0, 3}, k, 176, kSwiGLU,
                   kBias | kGather | (k == 1024 ? kPdl : 0)));
  run_case(Shape({7, 0, 12, 2}, 1024, 176, kReLU2, kGather));
  for (int n_out : {16, 512}) run_case(Shape({3, 16, 0, 9, 1}, 256, n_out, kIdentity, kBf16));
}

// One expert takes all 40 rows: tiles of 16, 16 and 8 rows at GEMM1's K
// (8 splits), and at a GEMM2-like shape.
TEST(Fp8StreamGemm, OneHotExpert) {
  UNIMOE_REQUIRE_GPU();
  run_case(Shape({0, 40, 0, 0}, 7168, 512, kOai, kBias | kGather));
  run_case(Shape({0, 40, 0, 0}, 512, 1792, kIdentity, kBf16));
}

TEST(Fp8StreamGemm, IntegerDataIsExact) {
  UNIMOE_REQUIRE_GPU();
  for (int k : {256, 7168})
    for (const std::vector<int>& counts : {ones(4), std::vector<int>{5, 16, 1, 9}}) {
      run_case(Shape(counts, k, 176, kIdentity, kInteger | kGather));
      run_case(Shape(counts, k, 176, kIdentity, kInteger | kBf16));
    }
}

// One capture, replayed for two schedules of different tile counts (both
// below max_tiles = 24) and new data in the same buffers.
void graph_replays_for_two_schedules(Shape s, std::vector<int> second_counts) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem first = make_problem(s, seed);
  s.counts = std::move(second_counts);
  const Problem second = make_problem(s, seed + 1);
  Problem sized = first;
  sized.s.spare_tiles = 24 - static_cast<int>(first.tiles.size());
  DeviceProblem dev(sized);

  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  graph = test::capture(stream, cudaStreamCaptureModeThreadLocal, [&] {
    launch(s, dev.params(sized), stream);
  });
  UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (const Problem* P : {&first, &second, &first}) {
    SCOPED_TRACE(P->s.label());
    ASSERT_EQ(P->rows, first.rows);
    dev.upload(*P);
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    check(*P, dev);
  }
  UNIMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  UNIMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  UNIMOE_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(Fp8StreamGemm, GraphReplaysForTwoSchedules) {
  UNIMOE_REQUIRE_GPU();
  Shape s(ones(8), 1024, 176, kSwiGLU, kBias | kGather | kPdl);
  s.out_rows = 64;
  graph_replays_for_two_schedules(s, {3, 0, 17, 1, 0, 0, 9, 0});
}

// ---- the FP8 wgmma kernel (kernels/gemm/sm90_fp8_wgmma_gemm.cuh), the
// same contract over 128-row tiles: its gated outputs come 64 columns a
// CTA, so gated n_out is a multiple of 64 here (gate and up rows still in
// different 128-row scale blocks at n_out 192).

// Tiles of 1 to 128 rows, an expert over three tiles, empty experts, K of
// 1 to 56 scale blocks (deeper than the pipeline), every epilogue.
TEST(Fp8WgmmaGemm, TilesOfEveryFillAndEveryEpilogue) {
  UNIMOE_REQUIRE_GPU();
  for (int k : {128, 512, 7168})
    run_case(Shape({2, 130, 0, 1, 300, 0, 64}, k, 192, kSwiGLU, kBias | kGather).on_wgmma());
  run_case(Shape({5, 140, 0, 9}, 1024, 128, kOai, kBias | kGather).on_wgmma());
  run_case(Shape({5, 140, 0, 9}, 1024, 256, kGeGLU, kGather).on_wgmma());
  run_case(Shape({70, 0, 129}, 768, 176, kReLU2, kGather).on_wgmma());
  for (int n_out : {16, 176, 1792}) run_case(Shape({3, 160, 0, 9, 1}, 256, n_out, kIdentity, kBf16).on_wgmma());
  run_case(Shape({3, 160, 0, 9, 1}, 2048, 7168, kIdentity, kBf16 | kBias).on_wgmma());
}

TEST(Fp8WgmmaGemm, OneHotExpert) {
  UNIMOE_REQUIRE_GPU();
  run_case(Shape({0, 400, 0, 0}, 7168, 512, kOai, kBias | kGather).on_wgmma());
  run_case(Shape({0, 400, 0, 0}, 512, 1792, kIdentity, kBf16).on_wgmma());
}

TEST(Fp8WgmmaGemm, IntegerDataIsExact) {
  UNIMOE_REQUIRE_GPU();
  for (int k : {256, 7168})
    for (const std::vector<int>& counts : {ones(4), std::vector<int>{5, 160, 1, 9}}) {
      run_case(Shape(counts, k, 176, kIdentity, kInteger | kGather).on_wgmma());
      run_case(Shape(counts, k, 176, kIdentity, kInteger | kBf16).on_wgmma());
    }
}

TEST(Fp8WgmmaGemm, GraphReplaysForTwoSchedules) {
  UNIMOE_REQUIRE_GPU();
  Shape s(std::vector<int>{40, 90, 3, 0, 200, 1, 0, 30}, 1024, 192, kSwiGLU, kBias | kGather);
  s.out_rows = 400;
  graph_replays_for_two_schedules(s.on_wgmma(), {3, 0, 170, 1, 0, 0, 190, 0});
}

TEST(Fp8WgmmaGemm, BadParametersNameTheField) {
  UNIMOE_REQUIRE_GPU();
  Shape s({130}, 256, 192, kSwiGLU, kGather);
  const Problem P = make_problem(s.on_wgmma(), 1);
  const DeviceProblem dev(P);
  const Fp8StreamGemmParams good = dev.params(P);
  auto refused = [&](const char* field, auto&& edit) {
    Fp8StreamGemmParams p = good;
    edit(p);
    try {
      launch_fp8_wgmma_gemm(p, nullptr);
      ADD_FAILURE() << field << ": accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  refused("k", [](Fp8StreamGemmParams& p) { p.k = 200; });
  refused("n_out", [](Fp8StreamGemmParams& p) { p.n_out = 176; });  // gated: a multiple of 64
  refused("b_rows", [](Fp8StreamGemmParams& p) { p.b_rows = 256; });
  refused("out_f32/out_bf16", [](Fp8StreamGemmParams& p) { p.out_bf16 = reinterpret_cast<uint16_t*>(p.out_f32); });
  refused("must not be null", [](Fp8StreamGemmParams& p) { p.b_scales = nullptr; });
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(Fp8StreamGemm, BadParametersNameTheField) {
  UNIMOE_REQUIRE_GPU();
  const Problem P = make_problem(Shape({1}, 128, 16, kIdentity), 1);
  const DeviceProblem dev(P);
  const Fp8StreamGemmParams good = dev.params(P);
  auto expect_refused = [&](const char* field, auto&& edit) {
    Fp8StreamGemmParams p = good;
    edit(p);
    try {
      launch_fp8_stream_gemm(p, nullptr);
      ADD_FAILURE() << field << ": accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("gemm: ") + field + " "), std::string::npos)
          << e.what();
    }
  };
  using Params = Fp8StreamGemmParams;
  expect_refused("k", [](Params& p) { p.k = 100; });
  expect_refused("n_out", [](Params& p) { p.n_out = 24; });
  expect_refused("a", [](Params& p) { p.a = nullptr; });
  expect_refused("b", [](Params& p) { p.b += 8; });
  expect_refused("b_scales", [](Params& p) { p.b_scales = nullptr; });
  expect_refused("num_tiles", [](Params& p) { p.num_tiles = nullptr; });
  expect_refused("out_f32/out_bf16",
                 [](Params& p) { p.out_bf16 = reinterpret_cast<uint16_t*>(p.out_f32); });
  expect_refused("out_f32/out_bf16", [](Params& p) { p.out_f32 = nullptr; });
  expect_refused("up_offset", [](Params& p) {  // b_rows = n_out: no room for the up rows
    p.epilogue = GemmEpilogue::SwiGLU;
    p.up_offset = p.n_out;
  });
  expect_refused("a_scales_ld", [](Params& p) { p.a_scales_ld = 0; });
  expect_refused("epilogue", [](Params& p) { p.epilogue = static_cast<GemmEpilogue>(9); });
}

}  // namespace
}  // namespace unimoe
