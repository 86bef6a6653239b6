// The GPU layer's plan: path and tactic choices at the points they were
// measured on (the figures are in src/plan/layer_plan.cpp), forced
// backends, refusals with reasons.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "dev/overrides.h"
#include "plan/layer_plan.h"
#include "plan/routing_plan.h"
#include "support/presets.h"
#include "core/tactics.h"

namespace unimoe {
namespace {

LayerPlan plan(const std::string& preset, int tokens, const std::string& backend = "auto") {
  MoEConfig c = find_preset(preset).config;
  c.options.backend = backend;
  return plan_for_tokens(c, tokens);
}

// The plan's path, tile rows and tactics (GEMM2's defaults to GEMM1's).
void expect_plan(const LayerPlan& p, ExpertsPath path, int tile_m, const std::string& gemm1,
                 const std::string& gemm2 = "") {
  EXPECT_EQ(p.path, path);
  EXPECT_EQ(p.tile_m, tile_m);
  EXPECT_EQ(p.gemm1.to_string(), gemm1);
  EXPECT_EQ(p.gemm2.to_string(), gemm2.empty() ? gemm1 : gemm2);
}

TEST(LayerPlan, DecodeTakesNarrowTilesOrTheStreamBackend) {
  // dsv3-tp8 (I = 256) at up to one row per expert: the Stream backend.
  for (int t : {1, 8, 32}) {
    SCOPED_TRACE("T=" + std::to_string(t));
    expect_plan(plan("dsv3-tp8", t), ExpertsPath::Stream, 16, "stream_m16");
  }
  // dsv3-tp8 T=64: 2 rows per expert -> 16-row tiles, 64 columns.
  EXPECT_EQ(plan("dsv3-tp8", 64).gemm1.to_string(), "m16n64");
  EXPECT_EQ(plan("dsv3-tp8", 64).gemm2.to_string(), "m16n64");
  // Any I up to half a row per expert: the Stream backend (its one-token
  // path; measured wins at T = 1-8).
  for (const auto& [preset, tokens] : {std::pair<std::string, int>{"qwen3-30b-a3b", 1},
                                       {"qwen3-235b-a22b", 8},   // 0.5 rows per expert
                                       {"gpt-oss-120b", 16},     // 0.5
                                       {"mixtral-8x7b", 2}}) {   // 0.5
    const LayerPlan p = plan(preset, tokens);
    SCOPED_TRACE(preset + " T=" + std::to_string(tokens));
    EXPECT_EQ(p.path, ExpertsPath::Stream);
    EXPECT_EQ(p.gemm1.to_string(), "stream_m16");
  }
  // I >= 768 above half a row up to 8 rows per expert: m16n64 (measured wins).
  for (const auto& [preset, tokens] : {std::pair<std::string, int>{"qwen3-30b-a3b", 9},
                                       {"qwen3-235b-a22b", 16},
                                       {"gpt-oss-120b", 17},
                                       {"mixtral-8x7b", 3},
                                       {"mixtral-8x7b", 32}}) {  // 8 rows per expert
    SCOPED_TRACE(preset + " T=" + std::to_string(tokens));
    expect_plan(plan(preset, tokens), ExpertsPath::Mma, 16, "m16n64");
  }
  // 16 rows per expert -> 32-row tiles, 64 columns (measured wins):
  // mixtral T=64 and dsv3-tp8 T=512; GEMM2 with five CTAs an SM (measured
  // faster).
  for (const auto& [preset, tokens] : {std::pair<std::string, int>{"mixtral-8x7b", 64},
                                       {"dsv3-tp8", 512}}) {
    SCOPED_TRACE(preset + " T=" + std::to_string(tokens));
    expect_plan(plan(preset, tokens), ExpertsPath::Mma, 32, "m32n64", "m32n64x5");
  }
}

// The stream path overlaps GEMM1's tail with GEMM2's first loads up to
// I = 4096 (measured: dsv3-tp8, qwen3-30b-a3b, gpt-oss-120b gained;
// mixtral-8x7b, I = 14336, lost); other paths never.
TEST(LayerPlan, StreamGemmOverlapUpToModerateIntermediate) {
  EXPECT_TRUE(plan("dsv3-tp8", 1).overlap_stream_gemms);
  EXPECT_TRUE(plan("gpt-oss-120b", 1).overlap_stream_gemms);
  const LayerPlan mixtral = plan("mixtral-8x7b", 1);
  EXPECT_EQ(mixtral.path, ExpertsPath::Stream);
  EXPECT_FALSE(mixtral.overlap_stream_gemms);
  EXPECT_FALSE(plan("qwen3-30b-a3b", 64).overlap_stream_gemms);  // the mma path
  EXPECT_FALSE(plan("dsv3-tp8", 1, "mma").overlap_stream_gemms);
  EXPECT_TRUE(plan("qwen3-30b-a3b", 64, "stream").overlap_stream_gemms);
}

TEST(LayerPlan, MTileChangesAtEachRowsPerExpertBoundary) {
  // mixtral-8x7b: E = 8, K = 2, so T / 4 rows per expert.
  struct Case {
    int tokens;
    double rows_per_expert;
    const char* expected;
  };
  const Case cases[] = {
      {32, 8, "path=mma tile_m=16 gemm1=m16n64 gemm2=m16n64"},
      {34, 8.5, "path=mma tile_m=32 gemm1=m32n64 gemm2=m32n64x5"},
      {36, 9, "path=mma tile_m=32 gemm1=m32n64 gemm2=m32n64x5"},
      {64, 16, "path=mma tile_m=32 gemm1=m32n64 gemm2=m32n64x5"},
      {68, 17, "path=mma tile_m=48 gemm1=m48n128 gemm2=m48n128"},
      {144, 36, "path=mma tile_m=48 gemm1=m48n128 gemm2=m48n128"},
      {148, 37, "path=mma tile_m=64 gemm1=m64n128 gemm2=m64n128"},
      {256, 64, "path=mma tile_m=64 gemm1=m64n128 gemm2=m64n128"},
      {260, 65, "path=mma tile_m=128 gemm1=m128n128 gemm2=m128n128"},
      {384, 96, "path=mma tile_m=128 gemm1=m128n128 gemm2=m128n128"},
      {388, 97, "path=cutlass sm90=coop_128x256x64"},  // the Cutlass crossover
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.rows_per_expert) + " rows per expert");
    EXPECT_EQ(plan("mixtral-8x7b", c.tokens).to_string(), c.expected);
  }
}

TEST(LayerPlan, PrintsWhatRuns) {
  EXPECT_EQ(plan("dsv3-tp8", 1).to_string(), "path=stream tile_m=16 gemm1=stream_m16 gemm2=stream_m16");
  EXPECT_EQ(plan("qwen3-30b-a3b", 512).to_string(), "path=mma tile_m=48 gemm1=m48n128 gemm2=m48n128");
  EXPECT_EQ(plan("qwen3-30b-a3b", 16384).to_string(), "path=cutlass sm90=coop_128x256x64");
}

TEST(LayerPlan, CutlassAboveTheMeasuredCrossover) {
  EXPECT_EQ(plan("qwen3-30b-a3b", 512).path, ExpertsPath::Mma);       // 32 rows per expert
  EXPECT_EQ(plan("qwen3-30b-a3b", 512).tile_m, 48);  // m48n128 won (measured)
  EXPECT_EQ(plan("qwen3-30b-a3b", 4096).path, ExpertsPath::Cutlass);  // 256 rows per expert
  EXPECT_EQ(plan("mixtral-8x7b", 64).path, ExpertsPath::Mma);         // 16 rows per expert
  EXPECT_EQ(plan("dsv3-tp8", 512).path, ExpertsPath::Mma);            // 16 rows: m32n64 won
  EXPECT_EQ(plan("mixtral-8x7b", 512).path, ExpertsPath::Cutlass);    // 128 rows per expert
}

TEST(LayerPlan, ForcedBackendsHoldAtEveryT) {
  for (int t : {1, 64, 16384}) {
    EXPECT_EQ(plan("qwen3-30b-a3b", t, "mma").path, ExpertsPath::Mma) << t;
    EXPECT_EQ(plan("qwen3-30b-a3b", t, "cutlass").path, ExpertsPath::Cutlass) << t;
    const LayerPlan s = plan("qwen3-30b-a3b", t, "stream");
    EXPECT_EQ(s.path, ExpertsPath::Stream) << t;
    EXPECT_EQ(s.tile_m, 16) << t;
    EXPECT_EQ(s.gemm1.to_string(), "stream_m16") << t;
  }
  // Forced Mma never streams, even where the rule would.
  const LayerPlan m = plan("dsv3-tp8", 1, "mma");
  EXPECT_EQ(m.path, ExpertsPath::Mma);
  EXPECT_EQ(m.gemm1.to_string(), "m16n64");
}

TEST(LayerPlan, EveryPlannedTacticIsCompiled) {
  auto compiled = [](const GemmTactic& t) {
    return std::any_of(std::begin(kMmaTactics), std::end(kMmaTactics), [&](const GemmTactic& c) {
      return c == t;
    });
  };
  for (const Preset& p : presets())
    for (int t : {1, 2, 3, 7, 8, 33, 36, 64, 100, 512, 1000, 4096, 16384}) {
      const LayerPlan lp = plan_for_tokens(p.config, t);
      SCOPED_TRACE(p.name + " T=" + std::to_string(t));
      EXPECT_TRUE(compiled(lp.gemm1)) << lp.gemm1.to_string();
      EXPECT_TRUE(compiled(lp.gemm2)) << lp.gemm2.to_string();
      EXPECT_EQ(lp.gemm1.tile_m, lp.tile_m);
      EXPECT_EQ(lp.gemm2.tile_m, lp.tile_m);
    }
}

TEST(LayerPlan, BackendNamesAndUnsupportedConfigsSayWhy) {
  EXPECT_NO_THROW(check_backend_name("auto"));
  EXPECT_NO_THROW(check_backend_name("cutlass"));
  EXPECT_NO_THROW(check_backend_name("stream"));
  for (ExpertsPath p : kExpertsPaths) EXPECT_EQ(parse_experts_path(path_name(p)), p);
  try {
    check_backend_name("triton");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "options.backend");
    EXPECT_NE(std::string(e.what()).find("allowed: auto, mma, cutlass, stream"), std::string::npos);
  }
  MoEConfig c = find_preset("gpt-oss-120b").config;
  EXPECT_EQ(gpu_unsupported_reason(c), "");
  c.experts.quant = QuantVariant::MXFP4;
  EXPECT_EQ(gpu_unsupported_reason(c), "");
}

// The fp8_tactic knob sets the FP8 cutlass path's two GEMM tactics (GEMM2's
// apart when given), wherever that path runs; other paths and BF16 ignore it.
TEST(LayerPlan, Fp8TacticKnobSetsEachGemmOnTheFp8CutlassPath) {
  MoEConfig c = find_preset("dsv3-tp8").config;
  c.experts.quant = QuantVariant::FP8Block128;
  DevOverrides dev;
  dev.set("fp8_tactic=fp8_coop_128x128x128:fp8_pingpong_64x128x128");
  for (int t : {512, 16384}) {
    const LayerPlan p = plan_layer(c, t, false, RoutingDeviceCaps{}, dev);
    EXPECT_EQ(p.path, ExpertsPath::Cutlass);
    EXPECT_EQ(p.sm90_fp8, Sm90Fp8GemmTactic::Cooperative128x128) << t;
    EXPECT_EQ(p.sm90_fp8_gemm2, Sm90Fp8GemmTactic::Pingpong64x128) << t;
    EXPECT_EQ(p.to_string(), "path=cutlass sm90=fp8_coop_128x128x128:fp8_pingpong_64x128x128");
  }
  dev.set("fp8_tactic=fp8_pingpong_64x128x128");
  const LayerPlan one = plan_layer(c, 16384, false, RoutingDeviceCaps{}, dev);
  EXPECT_EQ(one.sm90_fp8, Sm90Fp8GemmTactic::Pingpong64x128);
  EXPECT_EQ(one.sm90_fp8_gemm2, Sm90Fp8GemmTactic::Pingpong64x128);
  EXPECT_EQ(one.to_string(), "path=cutlass sm90=fp8_pingpong_64x128x128");
  EXPECT_EQ(plan_layer(c, 1, false, RoutingDeviceCaps{}, dev).path, ExpertsPath::Stream);
  c.experts.quant = QuantVariant::BF16;
  EXPECT_EQ(plan_layer(c, 16384, false, RoutingDeviceCaps{}, dev).to_string(),
            plan_layer(c, 16384, false, RoutingDeviceCaps{}, DevOverrides{}).to_string());
}

// The mma_tactic knob sets both GEMMs' tactics, and the schedule's M tile
// with them, wherever the mma path runs; other paths ignore it.
TEST(LayerPlan, MmaTacticKnobSetsBothGemmsOnTheMmaPath) {
  MoEConfig c = find_preset("qwen3-30b-a3b").config;
  c.options.backend = "mma";
  DevOverrides dev;
  dev.set("mma_tactic=wg_m128n256:wg_m128n128");
  for (int t : {1, 64, 16384}) {
    const LayerPlan p = plan_layer(c, t, false, RoutingDeviceCaps{}, dev);
    EXPECT_EQ(p.path, ExpertsPath::Mma);
    EXPECT_EQ(p.gemm1.to_string(), "wg_m128n256") << t;
    EXPECT_EQ(p.gemm2.to_string(), "wg_m128n128") << t;
    EXPECT_EQ(p.tile_m, 128) << t;
  }
  dev.set("mma_tactic=m64n128");
  const LayerPlan one = plan_layer(c, 512, false, RoutingDeviceCaps{}, dev);
  EXPECT_EQ(one.gemm1, (GemmTactic{64, 128}));
  EXPECT_EQ(one.gemm2, one.gemm1);
  EXPECT_EQ(one.tile_m, 64);
  c.options.backend = "cutlass";
  EXPECT_EQ(plan_layer(c, 512, false, RoutingDeviceCaps{}, dev).path, ExpertsPath::Cutlass);
  c.options.backend = "stream";
  EXPECT_EQ(plan_layer(c, 512, false, RoutingDeviceCaps{}, dev).gemm1.to_string(), "stream_m16");
}

TEST(LayerPlan, FourBitTakesTheStreamPathOnly) {
  for (QuantVariant q : {QuantVariant::MXFP4, QuantVariant::NVFP4}) {
    MoEConfig c = find_preset("gpt-oss-120b").config;  // H = I = 2880: 90 x 32
    c.experts.quant = q;
    EXPECT_EQ(gpu_unsupported_reason(c), "");
    for (int t : {1, 64, 4096, 16384}) EXPECT_EQ(plan_for_tokens(c, t).path, ExpertsPath::Stream) << t;
    // 64-row tiles (the kernel's rows form) from 16 rows an expert: E = 128,
    // K = 4 gives T / 32 rows an expert.
    for (auto [t, tile_m] : {std::pair{1, 16}, {64, 16}, {511, 16}, {512, 64}, {16384, 64}})
      EXPECT_EQ(plan_for_tokens(c, t).tile_m, tile_m) << t;
    const DeviceArch hopper{9, 0, 132};
    EXPECT_EQ(backend_unsupported_reason(ExpertsPath::Stream, c, hopper), "");
    for (ExpertsPath p : {ExpertsPath::Mma, ExpertsPath::Cutlass}) {
      const std::string why = backend_unsupported_reason(p, c, hopper);
      EXPECT_NE(why.find("runs on the stream path only"), std::string::npos) << why;
    }
    EXPECT_EQ(gpu_shape_multiple(q), 32);
  }
  // NVFP4's format allows H and I in multiples of 16; the W4A16 kernel needs 32.
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 8, 2, 272, 256);
  c.experts.quant = QuantVariant::NVFP4;
  EXPECT_NO_THROW(validate(c));
  EXPECT_NE(gpu_unsupported_reason(c).find("multiples of 32"), std::string::npos)
      << gpu_unsupported_reason(c);
}

TEST(LayerPlan, Fp8TakesTheStreamThenTheCutlassPathOrTheWgmmaKernelWhenForced) {
  for (QuantVariant q : {QuantVariant::FP8Block128, QuantVariant::FP8PerTensor}) {
    MoEConfig c = find_preset("dsv3-tp8").config;  // E 256, K 8: T / 32 rows per expert
    c.experts.quant = q;
    EXPECT_EQ(gpu_unsupported_reason(c), "");
    EXPECT_EQ(plan_for_tokens(c, 64).path, ExpertsPath::Stream);   // 2 rows per expert
    EXPECT_EQ(plan_for_tokens(c, 65).path, ExpertsPath::Cutlass);
    EXPECT_EQ(plan_for_tokens(c, 2047).to_string(), "path=cutlass sm90=fp8_pingpong_64x128x128");
    EXPECT_EQ(plan_for_tokens(c, 2048).to_string(), "path=cutlass sm90=fp8_coop_128x128x128");
    const DeviceArch hopper{9, 0, 132};
    EXPECT_EQ(backend_unsupported_reason(ExpertsPath::Mma, c, hopper), "");
    MoEConfig forced = c;
    forced.options.backend = "mma";
    for (int t : {1, 64, 4096})
      EXPECT_EQ(plan_for_tokens(forced, t).to_string(), "path=mma tile_m=128 gemm1=wg_m128n128 gemm2=wg_m128n128")
          << t;
    EXPECT_EQ(backend_unsupported_reason(ExpertsPath::Stream, c, hopper), "");
    EXPECT_EQ(backend_unsupported_reason(ExpertsPath::Cutlass, c, hopper), "");
  }
  // FP8PerTensor's format allows H and I in multiples of 16; the GPU's GEMMs need 128.
  MoEConfig oss = find_preset("gpt-oss-120b").config;  // H = I = 2880
  oss.experts.quant = QuantVariant::FP8PerTensor;
  EXPECT_NO_THROW(validate(oss));
  EXPECT_NE(gpu_unsupported_reason(oss).find("multiples of 128"), std::string::npos)
      << gpu_unsupported_reason(oss);
  EXPECT_EQ(gpu_shape_multiple(QuantVariant::FP8PerTensor), 128);
  EXPECT_EQ(gpu_shape_multiple(QuantVariant::BF16), 1);
}

// The decode knobs that remove kernels from the chain: fp8_quant_in_gemm
// only for FP8 on the stream path at one token; finalize_in_gemm2 up to its
// token count, for FP8 on the stream path and 4-bit weights on the 16-row
// form, never for BF16 or the other forms; both off by default.
TEST(LayerPlan, DecodeFoldsOnlyWhereTheirKernelsServe) {
  const RoutingDeviceCaps caps{};
  DevOverrides dev;
  dev.set("fp8_quant_in_gemm=1");
  dev.set("finalize_in_gemm2=8");
  MoEConfig fp8 = find_preset("dsv3-tp8").config;
  for (QuantVariant q : {QuantVariant::FP8Block128, QuantVariant::FP8PerTensor}) {
    fp8.experts.quant = q;
    for (int t : {1, 2, 8, 9, 64}) {
      const LayerPlan p = plan_layer(fp8, t, false, caps, dev);
      EXPECT_EQ(p.path, ExpertsPath::Stream) << t;
      EXPECT_EQ(p.fp8_quant_in_gemm, t == 1) << t;
      EXPECT_EQ(p.finalize_in_gemm2, t <= 8) << t;
      const LayerPlan plain = plan_layer(fp8, t, false, caps, DevOverrides{});
      EXPECT_FALSE(plain.fp8_quant_in_gemm || plain.finalize_in_gemm2) << t;
    }
    EXPECT_FALSE(plan_layer(fp8, 4096, false, caps, dev).finalize_in_gemm2);  // cutlass path
    EXPECT_FALSE(plan_layer(fp8, 0, false, caps, DevOverrides{}).finalize_in_gemm2);  // no call
    MoEConfig forced = fp8;
    forced.options.backend = "mma";  // the FP8 wgmma kernel does neither
    const LayerPlan mma = plan_layer(forced, 1, false, caps, dev);
    EXPECT_FALSE(mma.fp8_quant_in_gemm || mma.finalize_in_gemm2);
  }
  MoEConfig w4 = find_preset("gpt-oss-120b").config;
  w4.experts.quant = QuantVariant::MXFP4;
  for (int t : {1, 8}) {
    const LayerPlan p = plan_layer(w4, t, false, caps, dev);
    EXPECT_TRUE(p.finalize_in_gemm2) << t;
    EXPECT_FALSE(p.fp8_quant_in_gemm) << t;
  }
  DevOverrides rows = dev;
  rows.set("w4_tile_m=64");
  EXPECT_FALSE(plan_layer(w4, 1, false, caps, rows).finalize_in_gemm2);
  MoEConfig bf16 = find_preset("qwen3-30b-a3b").config;
  bf16.options.backend = "stream";
  const LayerPlan b = plan_layer(bf16, 1, false, caps, dev);
  EXPECT_FALSE(b.fp8_quant_in_gemm || b.finalize_in_gemm2);
}

TEST(RoutingVariantRule, EachVariantAtItsMeasuredWins) {
  auto variant = [](const std::string& preset, int tokens) {
    return routing_variant_for(find_preset(preset).config.routing, tokens);
  };
  // The routing sweep (layer_plan.cpp): the cluster variant for every
  // small call (it launches the fused block itself for the smallest):
  // DeepSeekV3 E=256 K=8 T=5 5.4 us vs fused 7.6; T=64 8.1 vs split 10.8.
  for (int t : {0, 1, 2, 5, 8, 64, 128})
    EXPECT_EQ(variant("dsv3-tp8", t), RoutingVariant::Cluster) << t;
  for (int t : {1, 8, 12, 13, 64, 192})
    EXPECT_EQ(variant("qwen3-30b-a3b", t), RoutingVariant::Cluster) << t;
  for (int t : {1, 12, 256}) EXPECT_EQ(variant("mixtral-8x7b", t), RoutingVariant::Cluster) << t;
  // The spread kernel up to 384 (DeepSeekV3 E=256 K=8 T=192
  // 7.9 us vs split 10.3; Renormalize E=128 K=8 T=256 5.4 vs 8.3).
  for (int t : {129, 191, 192, 256, 384})
    EXPECT_EQ(variant("dsv3-tp8", t), RoutingVariant::Cluster) << t;
  for (int t : {193, 256, 384})
    EXPECT_EQ(variant("qwen3-30b-a3b", t), RoutingVariant::Cluster) << t;
  // Split beyond: 32 tokens a CTA leave the spread kernel no permuting warp
  // at T=512, K=8.
  for (int t : {385, 512, 4096}) EXPECT_EQ(variant("dsv3-tp8", t), RoutingVariant::Split) << t;
  for (int t : {385, 512, 16384})
    EXPECT_EQ(variant("qwen3-30b-a3b", t), RoutingVariant::Split) << t;
  EXPECT_EQ(variant("mixtral-8x7b", 4096), RoutingVariant::Split);
}

TEST(RoutingVariantRule, EachLimitHoldsAtItsEdge) {
  auto config = [](RoutingPolicy policy, int experts, int top_k) {
    RoutingConfig r;
    r.policy = policy;
    r.num_experts = experts;
    r.top_k = top_k;
    return r;
  };
  const RoutingPolicy other = RoutingPolicy::Renormalize;
  // The rule never picks the fused block: the cluster variant launches it.
  for (int e : {8, 64, 1024})
    for (int k : {1, 8})
      for (int t : {0, 1, 4, 12}) {
        EXPECT_NE(routing_variant_for(config(other, e, k), t), RoutingVariant::Fused);
        EXPECT_NE(routing_variant_for(config(RoutingPolicy::DeepSeekV3, e, k), t),
                  RoutingVariant::Fused);
      }
  // Cluster up to T = last, split from last + 1.
  auto edge = [&](RoutingPolicy policy, int experts, int top_k, int last) {
    SCOPED_TRACE(to_string(policy) + " E=" + std::to_string(experts) + " K=" +
                 std::to_string(top_k));
    EXPECT_EQ(routing_variant_for(config(policy, experts, top_k), last), RoutingVariant::Cluster);
    EXPECT_EQ(routing_variant_for(config(policy, experts, top_k), last + 1), RoutingVariant::Split);
  };
  // The policies but DeepSeek's: T at most 256, T*K at most 2048, T*E at
  // most 131072; then the spread kernel from 128 to 384 where it serves
  // (not at E = 512 beyond 256: 24 tokens a CTA over the 8 CTAs its table
  // allows need more warps than the kernel's 16 a block).
  edge(other, 8, 1, 384);
  edge(other, 8, 8, 384);
  edge(other, 512, 1, 256);  // T*E <= 131072
  edge(other, 1024, 1, 128);
  edge(other, 64, 16, 128);  // K = 16: the limits (T*K <= 2048) alone
  for (RoutingPolicy ds : {RoutingPolicy::DeepSeekV3, RoutingPolicy::MiniMax2}) {
    // T at most 128, T*K at most 3072, T*E at most 65536; the spread kernel
    // to 384 where the cluster variant takes it by default, for K <= 8 (K =
    // 16 and 32 keep the limits).
    EXPECT_EQ(routing_variant_for(config(ds, 8, 1), 1), RoutingVariant::Cluster) << to_string(ds);
    edge(ds, 8, 1, 384);
    edge(ds, 64, 16, 128);
    edge(ds, 128, 32, 96);  // T*K <= 3072
    edge(ds, 64, 8, 384);
    edge(ds, 512, 1, 128);  // E=512: no permuting thread per expert, the limits alone
    edge(ds, 1024, 1, 64);
  }
}

TEST(RoutingVariantRule, NamesParseAndBadValuesSayWhatIsAllowed) {
  for (RoutingVariant v : {RoutingVariant::Split, RoutingVariant::Fused, RoutingVariant::Cluster})
    EXPECT_EQ(parse_routing_variant(routing_variant_name(v)), v);
  try {
    parse_routing_variant("clustered");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "options.routing_variant");
    EXPECT_NE(std::string(e.what()).find("allowed: split, fused, cluster"), std::string::npos);
  }
  EXPECT_STREQ(routing_variant_name(RoutingVariant::Cluster), "cluster");
}


// The stream kernel's K splits (stream_k_splits, src/core/tactics.h) at the
// shapes timed on an H200 (132 SMs).
TEST(StreamKSplits, LongestSplitThatLeavesEachWarp256OfK) {
  EXPECT_EQ(stream_k_splits(256, 7168, false, 8, 0), 1);   // dsv3-tp8 GEMM2: K = I = 256
  EXPECT_EQ(stream_k_splits(768, 2048, false, 8, 0), 2);   // qwen3-30b-a3b GEMM2
  EXPECT_EQ(stream_k_splits(1536, 4096, false, 8, 0), 4);  // qwen3-235b-a22b GEMM2
  EXPECT_EQ(stream_k_splits(2048, 768, true, 8, 0), 8);    // no SM count: no wave rule
  EXPECT_EQ(stream_k_splits(8, 16, true, 1, 132), 1);
}

TEST(StreamKSplits, EightSplitsBecomeFourBetweenOneAndAHalfAndSixWaves) {
  const int sms = 132;  // 264 CTA slots at 2 CTAs an SM
  // Taken (measured faster): qwen3-30b-a3b GEMM1 T=1, 768 CTAs (2.9 waves);
  // gpt-oss-120b GEMM1 T=1, 1440 (5.5) and GEMM2, 720 (2.7); mixtral-8x7b
  // GEMM2 T=1, 512 (1.9); qwen3-235b-a22b GEMM1 T=1, 1536 (5.8).
  EXPECT_EQ(stream_k_splits(2048, 768, true, 8, sms), 4);
  EXPECT_EQ(stream_k_splits(2880, 2880, true, 4, sms), 4);
  EXPECT_EQ(stream_k_splits(2880, 2880, false, 4, sms), 4);
  EXPECT_EQ(stream_k_splits(14336, 4096, false, 2, sms), 4);
  EXPECT_EQ(stream_k_splits(4096, 1536, true, 8, sms), 4);
  // Left at 8 (measured slower with 4): dsv3-tp8 GEMM1 T=1, 256 CTAs (0.97
  // waves) and T=8, 2048 (7.8; 64 tiles at most); mixtral-8x7b GEMM1 T=1,
  // 3584 (13.6).
  EXPECT_EQ(stream_k_splits(7168, 256, true, 8, sms), 8);
  EXPECT_EQ(stream_k_splits(7168, 256, true, 64, sms), 8);
  EXPECT_EQ(stream_k_splits(4096, 14336, true, 2, sms), 8);
  // The edges: 396 CTAs is 1.5 waves, 1584 is 6.
  EXPECT_EQ(stream_k_splits(2048, 8 * 396, true, 1, sms), 4);
  EXPECT_EQ(stream_k_splits(2048, 8 * 395, true, 1, sms), 8);
  EXPECT_EQ(stream_k_splits(2048, 8 * 1584, true, 1, sms), 4);
  EXPECT_EQ(stream_k_splits(2048, 8 * 1585, true, 1, sms), 8);
  // A cap (UNIMOE_STREAM_MAX_SPLITS) bounds the splits and skips the rule.
  EXPECT_EQ(stream_k_splits(2048, 768, true, 8, 0, 8), 8);
  EXPECT_EQ(stream_k_splits(2048, 768, true, 8, 0, 2), 2);
}

}  // namespace
}  // namespace unimoe
