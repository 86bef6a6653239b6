// The whole W4A16 layer on the device (MXFP4 and NVFP4 weights, bf16
// activations) against the CPU reference with the same dequantization:
// fresh random weights and inputs each run (the device quantizes the
// synthetic weights, the host regenerates the same codes and scales),
// output poisoned before each run, odd sizes (K not a multiple of 128,
// output columns odd multiples of 32), empty experts, one hot expert, an EP
// local range with off-rank rows, every activation with biases, the
// gpt-oss and DeepSeek shapes, precomputed routing, CUDA-graph replay with
// fresh routing, interleaved gate/up checkpoints, block scale codes over
// their whole range, the weight checks of set_weights, and both tile forms
// of the stream kernel.
//
// Metric: relative L2 error of the whole output below kTuningTolerance
// (1e-2): the kernels dequantize the weights exactly (an e2m1 value times
// a power of two, or times an e4m3 scale, is a bf16) and the activations
// are bf16 as in the reference, so only fp32 accumulation order and the
// bf16 rounding of act, y and the output differ, as for BF16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "gpu/layer_rig.h"
#include "kernels/common/fill.cuh"
#include "plan/autotune.h"
#include "ref/ref.h"
#include "ref/synthetic.h"
#include "support/presets.h"

namespace unimoe {
namespace {

using test::DeviceBuffer;
using test::hot_expert_logits;
using test::field_of;
using test::LayerRig;
constexpr double kTolerance = kTuningTolerance;
constexpr QuantVariant kFormats[] = {QuantVariant::MXFP4, QuantVariant::NVFP4};

// One fresh set of weights and inputs per point, run by each format (the
// layer built with `dev`'s overrides where given).
void check_point(MoEConfig c, int t, const std::string& kind, const DevOverrides* dev = nullptr) {
  const uint64_t seed = test::fresh_seed();
  const std::vector<float> logits =
      kind == "hot" ? hot_expert_logits(c, t, seed, int(seed % c.routing.num_experts))
                    : ref::make_logits(c, t, seed, kind);
  for (QuantVariant q : kFormats) {
    c.experts.quant = q;
    SCOPED_TRACE(c.to_string() + " T=" + std::to_string(t) + " " + kind + " seed " +
                 std::to_string(seed));
    LayerRig rig(c, t, seed, false, dev);
    rig.load_inputs(t, seed ^ 0xabc, logits);
    rig.layer().forward(rig.args(t), nullptr);
    const double err = rig.error(t, logits);
    EXPECT_LT(err, kTolerance) << rig.layer().describe(t);
    std::printf("  %s H=%d I=%d T=%d %s: error %.2e\n", to_string(q).c_str(), c.experts.hidden,
                c.experts.intermediate, t, kind.c_str(), err);
  }
}

TEST(LayerW4Gpu, TokenCountsOnOneShape) {
  UNIMOE_REQUIRE_GPU();
  // I = 384: GEMM2's K is three 128-value steps; rows per expert T * 4 / 16.
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 16, 4, 512, 384);
  for (int t : {1, 3, 8, 33, 130}) check_point(c, t, "uniform");
}

TEST(LayerW4Gpu, OddSizes) {
  UNIMOE_REQUIRE_GPU();
  // K = 96 and 160: a step of three lanes' 32 values, and a full step
  // followed by one of one lane's; output columns odd multiples of 32; E odd.
  for (auto [h, i] : {std::pair{96, 160}, std::pair{160, 96}, std::pair{2880, 2880}}) {
    MoEConfig c = moe_config(RoutingPolicy::Renormalize, 7, 3, h, i);
    for (int t : {1, 5, 19}) check_point(c, t, "uniform");
  }
}

// Every form of the W4A16 kernel, forced (development knob w4_tile_m): the
// 16-row form, the rows form of 64-row tiles and the wgmma form of 128-row
// tiles, on tiles of 1 to 128 rows, a hot expert (several tiles), K tails
// and a gated activation with biases.
TEST(LayerW4Gpu, EveryTileForm) {
  UNIMOE_REQUIRE_GPU();
  // The 16-row form with and without its pipelined load ring.
  for (const auto [tile_m, pipelined] : {std::pair{16, true}, {16, false}, {64, true}, {128, true}}) {
    DevOverrides dev;
    dev.w4_tile_m = tile_m;
    dev.w4_pipeline = pipelined;
    SCOPED_TRACE(dev.to_string());
    const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 16, 4, 512, 384);
    for (int t : {1, 3, 33, 130}) check_point(c, t, "uniform", &dev);
    check_point(c, 130, "hot", &dev);
    if (tile_m == 128) check_point(c, 600, "uniform", &dev);  // about 150 rows an expert: two tiles
    const MoEConfig odd = moe_config(RoutingPolicy::Renormalize, 7, 3, 160, 96);
    for (int t : {1, 19}) check_point(odd, t, "uniform", &dev);
    MoEConfig oai = moe_config(RoutingPolicy::Renormalize, 12, 3, 256, 128);
    oai.experts.activation = Activation::SwiGLUOai;
    oai.experts.swiglu_alpha = 1.702f;
    oai.experts.swiglu_limit = 7.0f;
    oai.experts.has_bias = true;
    check_point(oai, 50, "uniform", &dev);
  }
}

TEST(LayerW4Gpu, ModelShapesAtDecode) {
  UNIMOE_REQUIRE_GPU();
  for (const char* name : {"gpt-oss-120b", "dsv3-tp8"}) {
    const MoEConfig c = find_preset(name).config;
    for (int t : {1, 4}) check_point(c, t, "uniform");
  }
}

TEST(LayerW4Gpu, EveryActivationWithBiases) {
  UNIMOE_REQUIRE_GPU();
  for (Activation act : {Activation::SwiGLU, Activation::GeGLU, Activation::ReLU2, Activation::SwiGLUOai}) {
    MoEConfig c = moe_config(RoutingPolicy::Renormalize, 12, 3, 256, 128);
    c.experts.activation = act;
    if (act == Activation::SwiGLUOai) {
      c.experts.swiglu_alpha = 1.702f;
      c.experts.swiglu_limit = 7.0f;
    }
    c.experts.has_bias = act != Activation::SwiGLU;
    for (int t : {1, 50}) check_point(c, t, "uniform");
  }
}

TEST(LayerW4Gpu, OneHotExpertAndEmptyExperts) {
  UNIMOE_REQUIRE_GPU();
  const MoEConfig c = moe_config(RoutingPolicy::Renormalize, 64, 4, 256, 256);
  for (int t : {1, 40}) check_point(c, t, "hot");
  check_point(c, 300, "skewed");
}

TEST(LayerW4Gpu, ExpertParallelRangeDropsOffRankRows) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 64, 8, 256, 128);
  c.experts.local_expert_offset = 16;
  c.experts.num_local_experts = 16;
  for (int t : {1, 7, 200}) check_point(c, t, "uniform");
}

TEST(LayerW4Gpu, PrecomputedRouting) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 32, 4, 256, 128);
  c.experts.quant = QuantVariant::NVFP4;
  const int t = 77;
  LayerRig rig(c, t, seed);
  EXPECT_LT(rig.precomputed_routing_error(t, seed), kTolerance);
}

TEST(LayerW4Gpu, CapturedOnceReplaysWithFreshRouting) {
  UNIMOE_REQUIRE_GPU();
  for (QuantVariant q : kFormats) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(to_string(q) + " seed " + std::to_string(seed));
    MoEConfig c = find_preset("qwen3-30b-a3b").config;
    c.experts.quant = q;
    const int t = 37;
    LayerRig rig(c, t, seed);
    rig.load_inputs(t, seed, ref::make_logits(c, t, seed, "uniform"));
    test::CapturedForward graph(rig.layer(), rig.args(t));
    for (int replay = 0; replay < 3; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      const std::vector<float> logits = replay == 1 ? hot_expert_logits(c, t, seed + replay, 5)
                                                    : ref::make_logits(c, t, seed + replay, "uniform");
      rig.load_inputs(t, seed + 100 + replay, logits);
      graph.replay();
      EXPECT_LT(rig.error(t, logits), kTolerance);
    }
  }
}

// A checkpoint whose w13 rows (block scales, b13) alternate gate and up
// gives, with w13_interleaved, exactly the output of the same weights in
// gate-then-up order: set_weights reorders them into the same prepared copy.
TEST(LayerW4Gpu, InterleavedGateUpMatchesBitForBit) {
  UNIMOE_REQUIRE_GPU();
  for (QuantVariant q : kFormats) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(to_string(q) + " seed " + std::to_string(seed));
    MoEConfig c = moe_config(RoutingPolicy::Renormalize, 8, 2, 256, 160);
    c.experts.quant = q;
    c.experts.activation = Activation::SwiGLUOai;
    c.experts.swiglu_alpha = 1.702f;
    c.experts.swiglu_limit = 7.0f;
    c.experts.has_bias = true;
    const int t = 9, e = c.local_experts(), n1 = c.gemm1_cols(), h = c.experts.hidden;
    const int block = q == QuantVariant::MXFP4 ? 32 : 16;
    LayerRig rig(c, t, seed);
    const std::vector<float> logits = ref::make_logits(c, t, seed, "uniform");
    rig.load_inputs(t, seed, logits);
    rig.layer().forward(rig.args(t), nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    ASSERT_LT(rig.error(t, logits), kTolerance);
    const ForwardArgs args = rig.args(t);
    std::vector<uint16_t> straight(std::size_t(t) * h);
    UNIMOE_CUDA_CHECK(cudaMemcpy(straight.data(), args.out, straight.size() * 2, cudaMemcpyDeviceToHost));

    // Interleave the rig's rows: row 2r <- gate row r, row 2r + 1 <- up row r.
    const ExpertWeights w = rig.device_weights();
    const std::size_t code_row = h / 2, scale_row = h / block;
    DeviceBuffer<uint8_t> codes(std::size_t(e) * n1 * code_row), scales(std::size_t(e) * n1 * scale_row);
    DeviceBuffer<float> b13(std::size_t(e) * n1);
    const int half = n1 / 2;
    for (int x = 0; x < e; ++x)
      for (int r = 0; r < n1; ++r) {
        const std::size_t from = std::size_t(x) * n1 + r;
        const std::size_t to = std::size_t(x) * n1 + (r < half ? 2 * r : 2 * (r - half) + 1);
        UNIMOE_CUDA_CHECK(cudaMemcpy(codes.get() + to * code_row, static_cast<const uint8_t*>(w.w13) + from * code_row,
                                     code_row, cudaMemcpyDeviceToDevice));
        UNIMOE_CUDA_CHECK(cudaMemcpy(scales.get() + to * scale_row, w.w13_block_scale + from * scale_row,
                                     scale_row, cudaMemcpyDeviceToDevice));
        UNIMOE_CUDA_CHECK(cudaMemcpy(b13.get() + to, w.b13 + from, 4, cudaMemcpyDeviceToDevice));
      }
    ExpertWeights interleaved = w;
    interleaved.w13 = codes.get();
    interleaved.w13_block_scale = scales.get();
    interleaved.b13 = b13.get();
    interleaved.w13_interleaved = true;
    std::unique_ptr<MoELayer> layer = MoELayer::create(c, t);
    layer->set_weights(interleaved);
    DeviceBuffer<uint16_t> out(std::size_t(t) * h);
    out.poison();
    ForwardArgs a = args;
    a.out = out.get();
    layer->forward(a, nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(out.download(), straight);
  }
}

// Block scale codes over their range (MXFP4 e8m0 codes 0..250, 129 and
// above taking the kernel's second multiply; 251..254 times 6 pass fp32's
// largest value, so the reference's own weights would be inf; NVFP4 e4m3 codes of
// both signs, subnormals included) and random e2m1 codes, against the
// reference's exact dequantization; one expert, every token routed to it.
TEST(LayerW4Gpu, BlockScaleCodesOverTheirRange) {
  UNIMOE_REQUIRE_GPU();
  for (QuantVariant q : kFormats) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(to_string(q) + " seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    MoEConfig c = moe_config(RoutingPolicy::Renormalize, 2, 1, 128, 64);
    c.experts.quant = q;
    c.experts.activation = Activation::ReLU2;  // one set of rows: no gate overflow concerns
    const int e = 2, h = c.experts.hidden, i = c.experts.intermediate, n1 = c.gemm1_cols(), t = 3;
    const int block = q == QuantVariant::MXFP4 ? 32 : 16;
    // Expert 0: GEMM1 scales over the whole range, tiny x so the sums stay
    // finite; GEMM2 plain. Each row's blocks take codes spread over the range.
    auto make = [&](int rows, int cols, bool wide) {
      ref::QuantMatrix m;
      m.variant = q;
      m.rows = rows;
      m.cols = cols;
      m.data.resize(std::size_t(rows) * cols / 2);
      for (uint8_t& b : m.data) b = uint8_t(rng());
      m.block_scales.resize(std::size_t(rows) * (cols / block));
      for (std::size_t j = 0; j < m.block_scales.size(); ++j) {
        if (q == QuantVariant::MXFP4)
          m.block_scales[j] = wide ? uint8_t(j * 37 % 251) : uint8_t(118 + rng() % 8);
        else {
          uint8_t code = uint8_t(rng());
          if ((code & 0x7f) == 0x7f) code ^= 1;  // not NaN
          m.block_scales[j] = wide ? code : uint8_t(0x30 + rng() % 16);
        }
      }
      m.global_scale = q == QuantVariant::NVFP4 ? 3.7e-3f : 1.0f;
      return m;
    };
    std::vector<ref::QuantMatrix> w13, w2;
    for (int x = 0; x < e; ++x) {
      w13.push_back(make(n1, h, x == 0));
      w2.push_back(make(h, i, false));
    }
    // Upload in ExpertWeights' layout.
    std::vector<uint8_t> c13, s13, c2, s2;
    std::vector<float> g13, g2;
    for (int x = 0; x < e; ++x) {
      c13.insert(c13.end(), w13[x].data.begin(), w13[x].data.end());
      s13.insert(s13.end(), w13[x].block_scales.begin(), w13[x].block_scales.end());
      c2.insert(c2.end(), w2[x].data.begin(), w2[x].data.end());
      s2.insert(s2.end(), w2[x].block_scales.begin(), w2[x].block_scales.end());
      g13.push_back(w13[x].global_scale);
      g2.push_back(w2[x].global_scale);
    }
    DeviceBuffer<uint8_t> dc13(c13), ds13(s13), dc2(c2), ds2(s2);
    DeviceBuffer<float> dg13(g13), dg2(g2);
    ExpertWeights w;
    w.w13 = dc13.get();
    w.w2 = dc2.get();
    w.w13_block_scale = ds13.get();
    w.w2_block_scale = ds2.get();
    if (q == QuantVariant::NVFP4) {
      w.w13_scale = dg13.get();
      w.w2_scale = dg2.get();
    }
    std::unique_ptr<MoELayer> layer = MoELayer::create(c, t);
    layer->set_weights(w);
    // x: bf16 values of magnitude about 2^-100 (MXFP4's largest scales
    // reach 2^127), so every product and sum is finite; NVFP4 plain.
    std::vector<uint16_t> x_bits(std::size_t(t) * h);
    std::vector<float> x(x_bits.size());
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const float x_scale = q == QuantVariant::MXFP4 ? std::ldexp(1.0f, -100) : 1.0f;
    for (std::size_t j = 0; j < x.size(); ++j) {
      x_bits[j] = ref::f32_to_bf16(u(rng) * x_scale);
      x[j] = ref::bf16_to_f32(x_bits[j]);
    }
    ref::Routing routing;
    routing.num_tokens = t;
    routing.top_k = 1;
    routing.ids.assign(t, 0);
    routing.weights.assign(t, 1.0f);
    DeviceBuffer<uint16_t> dx(x_bits), out(std::size_t(t) * h);
    DeviceBuffer<int32_t> ids(routing.ids);
    DeviceBuffer<float> weights(routing.weights);
    out.poison();
    ForwardArgs a;
    a.num_tokens = t;
    a.x = dx.get();
    a.topk_ids = ids.get();
    a.topk_weights = weights.get();
    a.out = out.get();
    layer->forward(a, nullptr);
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<std::vector<float>> v13, v2;
    for (int x2 = 0; x2 < e; ++x2) {
      v13.push_back(ref::dequantize(w13[x2]));
      v2.push_back(ref::dequantize(w2[x2]));
    }
    const ref::WeightSource source = [&](int x2) {
      return ref::ExpertView{v13[x2].data(), v2[x2].data(), nullptr, nullptr};
    };
    const std::vector<float> want = ref::moe_forward(c, source, x.data(), routing);
    const std::vector<uint16_t> bits = out.download();
    std::vector<float> got(bits.size());
    for (std::size_t j = 0; j < got.size(); ++j) got[j] = ref::bf16_to_f32(bits[j]);
    bool finite = true;
    for (float v : want) finite = finite && std::isfinite(v);
    ASSERT_TRUE(finite) << "the reference overflowed: the test's inputs need smaller values";
    EXPECT_LT(test::rel_l2(got, want), kTolerance);
  }
}

TEST(LayerW4Gpu, AutotuneTimesTheStreamPathAndServesIt) {
  UNIMOE_REQUIRE_GPU();
  for (QuantVariant q : kFormats) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(to_string(q) + " seed " + std::to_string(seed));
    MoEConfig c = moe_config(RoutingPolicy::Renormalize, 16, 4, 256, 128);
    c.experts.quant = q;
    LayerRig rig(c, 64, seed);
    AutotuneOptions o;
    o.tokens = {1, 33};
    o.iters = 3;
    std::vector<std::string> lines;
    o.progress = [&](const std::string& line) { lines.push_back(line); };
    const std::string report = rig.layer().autotune(o);
    int timed_stream = 0, timed_other = 0;
    for (const std::string& line : lines) {
      if (line.rfind("timed ", 0) != 0) continue;
      const bool stream = line.find("path=stream") != std::string::npos;
      timed_stream += stream;
      timed_other += !stream;
    }
    EXPECT_GT(timed_stream, 0) << report;
    EXPECT_EQ(timed_other, 0) << report;
    for (int t : {1, 33}) {
      const std::vector<float> logits = ref::make_logits(c, t, seed + t, "uniform");
      rig.load_inputs(t, seed ^ t, logits);
      rig.layer().forward(rig.args(t), nullptr);
      EXPECT_LT(rig.error(t, logits), kTolerance) << "T=" << t << " " << rig.layer().describe(t);
    }
  }
}


TEST(LayerW4Gpu, SetWeightsChecksTheScalesOfEachVariant) {
  UNIMOE_REQUIRE_GPU();
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 8, 2, 128, 128);
  c.experts.quant = QuantVariant::MXFP4;
  LayerRig rig(c, 4, 1);
  DeviceBuffer<uint8_t> w(8 * 256 * 64), s(8 * 256 * 8);
  DeviceBuffer<float> g(8);
  ExpertWeights ok;
  ok.w13 = w.get();
  ok.w2 = w.get();
  ok.w13_block_scale = s.get();
  ok.w2_block_scale = s.get();
  ExpertWeights no_block = ok;
  no_block.w2_block_scale = nullptr;
  EXPECT_EQ(field_of([&] { rig.layer().set_weights(no_block); }), "weights.w2_block_scale");
  ExpertWeights mx_with_matrix_scale = ok;
  mx_with_matrix_scale.w13_scale = g.get();
  EXPECT_EQ(field_of([&] { rig.layer().set_weights(mx_with_matrix_scale); }), "weights.w13_scale");
  // The block scales are bytes, read a byte at a time: any address serves
  // (a rank's slice of a model's scales starts where its first expert does).
  ExpertWeights unaligned_blocks = ok;
  unaligned_blocks.w13_block_scale = s.get() + 1;
  EXPECT_EQ(field_of([&] { rig.layer().set_weights(unaligned_blocks); }), "no error");
  // NVFP4 needs its matrix scales, fp32, 4-byte aligned.
  MoEConfig nv = c;
  nv.experts.quant = QuantVariant::NVFP4;
  LayerRig nv_rig(nv, 4, 1);
  EXPECT_EQ(field_of([&] { nv_rig.layer().set_weights(ok); }), "weights.w13_scale");
  ExpertWeights nv_ok = ok;
  nv_ok.w13_scale = g.get() + 1;  // 4 bytes in: served
  nv_ok.w2_scale = g.get();
  EXPECT_EQ(field_of([&] { nv_rig.layer().set_weights(nv_ok); }), "no error");
  ExpertWeights nv_misaligned = nv_ok;
  nv_misaligned.w2_scale = reinterpret_cast<const float*>(reinterpret_cast<const char*>(g.get()) + 2);
  EXPECT_EQ(field_of([&] { nv_rig.layer().set_weights(nv_misaligned); }), "weights.w2_scale");
  // BF16 takes no block scales and no interleave flag.
  MoEConfig b = c;
  b.experts.quant = QuantVariant::BF16;
  LayerRig bf16(b, 4, 1);
  EXPECT_EQ(field_of([&] { bf16.layer().set_weights(ok); }), "weights.w13_block_scale");
  ExpertWeights bf16_interleaved = bf16.device_weights();
  bf16_interleaved.w13_interleaved = true;
  EXPECT_EQ(field_of([&] { bf16.layer().set_weights(bf16_interleaved); }), "weights.w13_interleaved");
  // Interleaving needs gate and up rows.
  MoEConfig relu = c;
  relu.experts.activation = Activation::ReLU2;
  LayerRig relu_rig(relu, 4, 1);
  ExpertWeights relu_interleaved = relu_rig.device_weights();
  relu_interleaved.w13_interleaved = true;
  EXPECT_EQ(field_of([&] { relu_rig.layer().set_weights(relu_interleaved); }), "weights.w13_interleaved");
  // The 4-bit variants run on the stream path only.
  for (const char* backend : {"mma", "cutlass"}) {
    MoEConfig forced = c;
    forced.options.backend = backend;
    EXPECT_EQ(field_of([&] { MoELayer::create(forced, 4); }), "options.backend") << backend;
  }
  std::unique_ptr<MoELayer> layer = MoELayer::create(c, 4096);
  EXPECT_EQ(layer->describe(1).rfind("path=stream", 0), 0u) << layer->describe(1);
  EXPECT_EQ(layer->describe(4096).rfind("path=stream", 0), 0u) << layer->describe(4096);
}

}  // namespace
}  // namespace unimoe
