// DevOverrides: one parser for every development knob, validated.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "dev/overrides.h"

namespace unimoe {
namespace {

// Sets an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(DevOverrides, DefaultsFollowTheMeasuredRules) {
  const DevOverrides d;
  EXPECT_TRUE(d.sorted_pair && d.direct_keys && d.cluster_spread && d.fixed_choice &&
              d.ranked_threshold && d.split_octet_count && d.split_kept_halves &&
              d.permute_trigger && d.scatter_masks && d.pdl && d.stream_one_token &&
              d.stream_overlap && d.next_prefetch && d.fp8_wide_ctas && d.fp8_quant_early &&
              d.fp8_act_quant_fused && d.fp8_quant_scatter && d.fp8_tensor_scale_first &&
              d.row_scatter);
  // The knobs that turn something on: the wgmma tuning candidates, the
  // 4-bit pipelined load ring, the FP8 decode GEMMs quantizing their own
  // input and GEMM2's folded finalize.
  EXPECT_FALSE(d.tune_wgmma || d.w4_pipeline || d.fp8_quant_in_gemm);
  EXPECT_EQ(d.finalize_in_gemm2, 0);
  EXPECT_EQ(d.wide_choice, WideChoice::kMeasured);
  EXPECT_EQ(d.cluster_max_ctas + d.spread_max_ctas + d.spread_from_tokens + d.spread_min_tokens +
                d.cluster_min_tokens + d.split_batch_min_tokens + d.split_sort_from_topk +
                d.split_octets_min_tokens + d.split_octet_filter_min_tokens + d.stream_max_splits +
                d.w4_tile_m,
            0);
  EXPECT_EQ(d.to_string(), "");
}

TEST(DevOverrides, SetTakesEveryKnobAndToStringTakesItBack) {
  DevOverrides d;
  d.set("sorted_pair=0");
  d.set("UNIMOE_CLUSTER_MAX_CTAS=16");
  d.set("Spread_From_Tokens=33");
  d.set("wide_choice=1");
  d.set("stream_max_splits=4");
  d.set("gemm2_path=combine");
  d.set("mma_tactic=wg_m128n256:m128n128");
  d.set("fp8_tactic=fp8_coop_128x128x128:fp8_pingpong_64x128x128");
  d.set("fp8_tensor_scale_first=0");
  d.set("tune_wgmma=1");
  d.set("fp8_quant_in_gemm=1");
  d.set("finalize_in_gemm2=8");
  EXPECT_FALSE(d.sorted_pair);
  EXPECT_TRUE(d.fp8_quant_in_gemm);
  EXPECT_EQ(d.finalize_in_gemm2, 8);
  EXPECT_EQ(d.cluster_max_ctas, 16);
  EXPECT_EQ(d.spread_from_tokens, 33);
  EXPECT_EQ(d.wide_choice, WideChoice::kEverywhere);
  EXPECT_EQ(d.stream_max_splits, 4);
  EXPECT_EQ(d.gemm2_path, DevGemm2Path::kCombine);
  EXPECT_TRUE(d.tune_wgmma);
  EXPECT_FALSE(d.fp8_tensor_scale_first);
  const std::string text = d.to_string();
  EXPECT_EQ(text,
            "sorted_pair=0 spread_from_tokens=33 cluster_max_ctas=16 wide_choice=1 "
            "stream_max_splits=4 fp8_quant_in_gemm=1 finalize_in_gemm2=8 gemm2_path=combine "
            "mma_tactic=wg_m128n256:m128n128 fp8_tactic=fp8_coop_128x128x128:fp8_pingpong_64x128x128 fp8_tensor_scale_first=0 "
            "tune_wgmma=1");
  DevOverrides back;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find(' ', start);
    back.set(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    start = end == std::string::npos ? text.size() : end + 1;
  }
  EXPECT_EQ(back, d);
  EXPECT_EQ(DevOverrides::names().size(), 38u);
}

TEST(DevOverrides, RefusesBadValuesNamingTheVariable) {
  auto refused = [](const std::string& nv, const std::string& words) {
    DevOverrides d;
    try {
      d.set(nv);
      ADD_FAILURE() << nv << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused("sorted_pair=2", "UNIMOE_SORTED_PAIR is '2'; allowed: 0 (off) or 1");
  refused("sorted_pair=", "UNIMOE_SORTED_PAIR is ''");
  refused("pdl=yes", "UNIMOE_PDL is 'yes'");
  refused("cluster_max_ctas=1", "2..16");
  refused("cluster_max_ctas=17", "2..16");
  refused("spread_max_ctas=-3", "UNIMOE_SPREAD_MAX_CTAS is '-3'");
  refused("spread_from_tokens=12x", "positive integer");
  refused("stream_max_splits=3", "1, 2, 4 or 8");
  refused("w4_tile_m=32", "16, 64 or 128");
  refused("wide_choice=2", "measured");
  refused("gemm2_path=fused", "UNIMOE_GEMM2_PATH is 'fused'; allowed: auto (the rule, the default), "
                              "expert, combine or gate");
  refused("mma_tactic=m64n128:m16n64", "UNIMOE_MMA_TACTIC is 'm64n128:m16n64'; allowed: auto");
  refused("mma_tactic=stream_m16", "tiled mma tactics of one tile_m");
  refused("mma_tactic=m128n512", "not a compiled mma tactic");
  refused("fp8_tactic=fp8_coop_128x256x128", "UNIMOE_FP8_TACTIC is 'fp8_coop_128x256x128'; allowed: auto");
  refused("fp8_tactic=fp8_coop_128x128x128:coop_128x128x64", "fp8_pingpong_64x128x128");
  refused("tune_wgmma=2", "UNIMOE_TUNE_WGMMA is '2'; allowed: 0 (off, the default) or 1 (on)");
  refused("finalize_in_gemm2=-1",
          "UNIMOE_FINALIZE_IN_GEMM2 is '-1'; allowed: 0 (off, the default) or the largest token count");
  refused("no_such_knob=1", "not name=value with a known name");
  refused("sorted_pair", "not name=value");
}

TEST(DevOverrides, FromEnvironmentReadsAndValidates) {
  {
    ScopedEnv a("UNIMOE_SCATTER_MASKS", "0");
    ScopedEnv b("UNIMOE_SPLIT_OCTETS_MIN_TOKENS", "4096");
    const DevOverrides d = DevOverrides::from_environment();
    EXPECT_FALSE(d.scatter_masks);
    EXPECT_EQ(d.split_octets_min_tokens, 4096);
  }
  {
    ScopedEnv bad("UNIMOE_DIRECT_KEYS", "off");
    EXPECT_THROW(DevOverrides::from_environment(), std::invalid_argument);
  }
  {
    ScopedEnv typo("UNIMOE_SORTED_PAIRS", "0");
    EXPECT_THROW(DevOverrides::from_environment(), std::invalid_argument);
  }
  {
    ScopedEnv old("UNIMOE_ROUTING_VARIANT", "split");
    try {
      DevOverrides::from_environment();
      ADD_FAILURE() << "UNIMOE_ROUTING_VARIANT was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("routing_variant"), std::string::npos) << e.what();
    }
  }
  {
    ScopedEnv scripts("UNIMOE_JOBS", "2");  // the scripts' own variables are left alone
    EXPECT_NO_THROW(DevOverrides::from_environment());
  }
  {
    // The Python package's: where it finds libunimoe_c.so, set in the
    // process whose layers then read the environment.
    ScopedEnv python("UNIMOE_LIBRARY", "/opt/unimoe/libunimoe_c.so");
    EXPECT_NO_THROW(DevOverrides::from_environment());
  }
}

}  // namespace
}  // namespace unimoe
