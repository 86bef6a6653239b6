#include "dev/overrides.h"

#include "core/tactics.h"
#include "unimoe/unimoe.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace unimoe {
namespace {

// How one knob's value is read and checked.
enum class Kind { Switch, OptIn, Count, UpTo, Ctas, Splits, TileM, Wide, Gemm2, Tactic, Fp8Tactic };

struct Knob {
  const char* name;  // lower case, without the UNIMOE_ prefix
  Kind kind;
  bool DevOverrides::*flag;
  int DevOverrides::*number;
};

constexpr Knob kKnobs[] = {
    {"sorted_pair", Kind::Switch, &DevOverrides::sorted_pair, nullptr},
    {"direct_keys", Kind::Switch, &DevOverrides::direct_keys, nullptr},
    {"cluster_spread", Kind::Switch, &DevOverrides::cluster_spread, nullptr},
    {"spread_from_tokens", Kind::Count, nullptr, &DevOverrides::spread_from_tokens},
    {"spread_max_ctas", Kind::Ctas, nullptr, &DevOverrides::spread_max_ctas},
    {"spread_min_tokens", Kind::Count, nullptr, &DevOverrides::spread_min_tokens},
    {"cluster_min_tokens", Kind::Count, nullptr, &DevOverrides::cluster_min_tokens},
    {"cluster_max_ctas", Kind::Ctas, nullptr, &DevOverrides::cluster_max_ctas},
    {"fixed_choice", Kind::Switch, &DevOverrides::fixed_choice, nullptr},
    {"ranked_threshold", Kind::Switch, &DevOverrides::ranked_threshold, nullptr},
    {"wide_choice", Kind::Wide, nullptr, nullptr},
    {"split_batch_min_tokens", Kind::Count, nullptr, &DevOverrides::split_batch_min_tokens},
    {"split_sort_from_topk", Kind::Count, nullptr, &DevOverrides::split_sort_from_topk},
    {"split_octets_min_tokens", Kind::Count, nullptr, &DevOverrides::split_octets_min_tokens},
    {"split_octet_filter_min_tokens", Kind::Count, nullptr,
     &DevOverrides::split_octet_filter_min_tokens},
    {"split_octet_count", Kind::Switch, &DevOverrides::split_octet_count, nullptr},
    {"split_kept_halves", Kind::Switch, &DevOverrides::split_kept_halves, nullptr},
    {"permute_trigger", Kind::Switch, &DevOverrides::permute_trigger, nullptr},
    {"scatter_masks", Kind::Switch, &DevOverrides::scatter_masks, nullptr},
    {"pdl", Kind::Switch, &DevOverrides::pdl, nullptr},
    {"stream_one_token", Kind::Switch, &DevOverrides::stream_one_token, nullptr},
    {"stream_max_splits", Kind::Splits, nullptr, &DevOverrides::stream_max_splits},
    {"stream_overlap", Kind::Switch, &DevOverrides::stream_overlap, nullptr},
    {"next_prefetch", Kind::Switch, &DevOverrides::next_prefetch, nullptr},
    {"fp8_wide_ctas", Kind::Switch, &DevOverrides::fp8_wide_ctas, nullptr},
    {"fp8_quant_early", Kind::Switch, &DevOverrides::fp8_quant_early, nullptr},
    {"fp8_act_quant_fused", Kind::Switch, &DevOverrides::fp8_act_quant_fused, nullptr},
    {"fp8_quant_scatter", Kind::Switch, &DevOverrides::fp8_quant_scatter, nullptr},
    {"row_scatter", Kind::Switch, &DevOverrides::row_scatter, nullptr},
    {"w4_tile_m", Kind::TileM, nullptr, &DevOverrides::w4_tile_m},
    {"w4_pipeline", Kind::OptIn, &DevOverrides::w4_pipeline, nullptr},
    {"fp8_quant_in_gemm", Kind::OptIn, &DevOverrides::fp8_quant_in_gemm, nullptr},
    {"finalize_in_gemm2", Kind::UpTo, nullptr, &DevOverrides::finalize_in_gemm2},
    {"gemm2_path", Kind::Gemm2, nullptr, nullptr},
    {"mma_tactic", Kind::Tactic, nullptr, nullptr},
    {"fp8_tactic", Kind::Fp8Tactic, nullptr, nullptr},
    {"fp8_tensor_scale_first", Kind::Switch, &DevOverrides::fp8_tensor_scale_first, nullptr},
    {"tune_wgmma", Kind::OptIn, &DevOverrides::tune_wgmma, nullptr},
};

// UNIMOE_* variables that belong to the scripts and the test programs, not
// to the library: the parser leaves them alone.
constexpr const char* kForeignVariables[] = {
    "UNIMOE_TEST_SEED",    "UNIMOE_JOBS",        "UNIMOE_GTEST_FILTER", "UNIMOE_TEST_TIMEOUT",
    "UNIMOE_SWEEP_TIMEOUT", "UNIMOE_SWEEP_ITERS", "UNIMOE_BUILD_DIR",   "UNIMOE_CUDA",
    "UNIMOE_DEPS_DIR",     "UNIMOE_CUTLASS_INCLUDE", "UNIMOE_ROUTING_STAMPS", "UNIMOE_LIBRARY",
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const Knob* find_knob(const std::string& name) {
  for (const Knob& k : kKnobs)
    if (name == k.name) return &k;
  return nullptr;
}

std::string variable(const Knob& k) {
  std::string v = "UNIMOE_";
  for (const char* c = k.name; *c; ++c)
    v += static_cast<char>(std::toupper(static_cast<unsigned char>(*c)));
  return v;
}

[[noreturn]] void refuse(const Knob& k, const std::string& value, const std::string& allowed) {
  throw std::invalid_argument(variable(k) + " is '" + value + "'; allowed: " + allowed);
}

// A whole decimal integer, or refuse.
int whole_number(const Knob& k, const std::string& value, const std::string& allowed) {
  if (value.empty() || value.size() > 9) refuse(k, value, allowed);
  for (char c : value)
    if (!std::isdigit(static_cast<unsigned char>(c))) refuse(k, value, allowed);
  return std::atoi(value.c_str());
}

void apply(DevOverrides& d, const Knob& k, const std::string& value) {
  switch (k.kind) {
    case Kind::Switch:
      if (value != "0" && value != "1") refuse(k, value, "0 (off) or 1 (on, the default)");
      d.*k.flag = value == "1";
      return;
    case Kind::OptIn:
      if (value != "0" && value != "1") refuse(k, value, "0 (off, the default) or 1 (on)");
      d.*k.flag = value == "1";
      return;
    case Kind::Count:
      d.*k.number = whole_number(k, value, "0 (the measured rule) or a positive integer");
      return;
    case Kind::UpTo:
      d.*k.number = whole_number(k, value, "0 (off, the default) or the largest token count it serves");
      return;
    case Kind::Ctas: {
      const int n = whole_number(k, value, "0 (the measured rule) or 2..16");
      if (n == 1 || n > 16) refuse(k, value, "0 (the measured rule) or 2..16");
      d.*k.number = n;
      return;
    }
    case Kind::Splits: {
      const int n = whole_number(k, value, "0 (the measured rule), 1, 2, 4 or 8");
      if (n != 0 && n != 1 && n != 2 && n != 4 && n != 8)
        refuse(k, value, "0 (the measured rule), 1, 2, 4 or 8");
      d.*k.number = n;
      return;
    }
    case Kind::TileM: {
      const char* allowed = "0 (the measured rule), 16, 64 or 128";
      const int n = whole_number(k, value, allowed);
      if (n != 0 && n != 16 && n != 64 && n != 128) refuse(k, value, allowed);
      d.*k.number = n;
      return;
    }
    case Kind::Wide:
      if (value == "0") {
        d.wide_choice = WideChoice::kOff;
      } else if (value == "1") {
        d.wide_choice = WideChoice::kEverywhere;
      } else if (value == "measured") {
        d.wide_choice = WideChoice::kMeasured;
      } else {
        refuse(k, value, "0 (never), 1 (wherever it serves) or measured (the default)");
      }
      return;
    case Kind::Gemm2:
      if (value == "auto") {
        d.gemm2_path = DevGemm2Path::kRule;
      } else if (value == "expert") {
        d.gemm2_path = DevGemm2Path::kExpert;
      } else if (value == "combine") {
        d.gemm2_path = DevGemm2Path::kCombine;
      } else if (value == "gate") {
        d.gemm2_path = DevGemm2Path::kGate;
      } else {
        refuse(k, value, "auto (the rule, the default), expert, combine or gate");
      }
      return;
    case Kind::Tactic: {
      if (value == "auto") {
        d.mma_tactic.clear();
        return;
      }
      const std::string allowed = "auto (the rule, the default), or G1 or G1:G2 with tiled mma tactics of "
                                  "one tile_m, e.g. wg_m128n256:wg_m128n128";
      GemmTactic g1, g2;
      try {
        const std::size_t colon = value.find(':');
        g1 = parse_gemm_tactic(value.substr(0, colon));
        g2 = colon == std::string::npos ? g1 : parse_gemm_tactic(value.substr(colon + 1));
      } catch (const Error& e) {
        refuse(k, value, allowed + " (" + e.what() + ")");
      }
      if (g1.stream || g2.stream || g1.tile_m != g2.tile_m) refuse(k, value, allowed);
      d.mma_tactic = value;
      return;
    }
    case Kind::Fp8Tactic: {
      if (value == "auto") {
        d.fp8_tactic.clear();
        return;
      }
      const std::size_t colon = value.find(':');
      try {
        parse_sm90_fp8_gemm_tactic(value.substr(0, colon));
        if (colon != std::string::npos) parse_sm90_fp8_gemm_tactic(value.substr(colon + 1));
      } catch (const Error& e) {
        refuse(k, value, std::string("auto (the rule, the default), or G1 or G1:G2 with FP8 cutlass "
                                     "tactics, e.g. fp8_coop_128x128x128:fp8_pingpong_64x128x128 (") +
                             e.what() + ")");
      }
      d.fp8_tactic = value;
      return;
    }
  }
}

std::string value_of(const DevOverrides& d, const Knob& k) {
  switch (k.kind) {
    case Kind::Switch:
    case Kind::OptIn: return d.*k.flag ? "1" : "0";
    case Kind::Gemm2:
      return d.gemm2_path == DevGemm2Path::kExpert    ? "expert"
             : d.gemm2_path == DevGemm2Path::kCombine ? "combine"
             : d.gemm2_path == DevGemm2Path::kGate    ? "gate"
                                                      : "auto";
    case Kind::Wide:
      return d.wide_choice == WideChoice::kOff        ? "0"
             : d.wide_choice == WideChoice::kEverywhere ? "1"
                                                        : "measured";
    case Kind::Tactic: return d.mma_tactic.empty() ? "auto" : d.mma_tactic;
    case Kind::Fp8Tactic: return d.fp8_tactic.empty() ? "auto" : d.fp8_tactic;
    default: return std::to_string(d.*k.number);
  }
}

}  // namespace

void DevOverrides::set(const std::string& name_value) {
  const std::size_t eq = name_value.find('=');
  std::string name = lower(name_value.substr(0, eq));
  if (name.rfind("unimoe_", 0) == 0) name = name.substr(7);
  const Knob* k = find_knob(name);
  if (eq == std::string::npos || k == nullptr) {
    std::string all;
    for (const Knob& knob : kKnobs) all += std::string(all.empty() ? "" : ", ") + knob.name;
    throw std::invalid_argument("development override '" + name_value +
                                "' is not name=value with a known name; names: " + all);
  }
  apply(*this, *k, name_value.substr(eq + 1));
}

DevOverrides DevOverrides::from_environment() {
  DevOverrides d;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    if (entry.rfind("UNIMOE_", 0) != 0) continue;
    const std::string name = entry.substr(0, entry.find('='));
    const bool foreign = std::any_of(std::begin(kForeignVariables), std::end(kForeignVariables),
                                     [&](const char* f) { return name == f; });
    if (foreign) continue;
    if (name == "UNIMOE_ROUTING_VARIANT")
      throw std::invalid_argument(
          "UNIMOE_ROUTING_VARIANT is no longer read: set BackendOptions::routing_variant "
          "(config text routing_variant=split|fused|cluster; unimoe-bench --routing-variant)");
    if (find_knob(lower(name.substr(7))) == nullptr)
      throw std::invalid_argument(name + " is not a unimoe variable; the development knobs are " +
                                  "listed in docs/benchmarking.md");
    d.set(entry);
  }
  return d;
}

std::string DevOverrides::to_string() const {
  const DevOverrides defaults;
  std::string s;
  for (const Knob& k : kKnobs) {
    const std::string v = value_of(*this, k);
    if (v == value_of(defaults, k)) continue;
    s += std::string(s.empty() ? "" : " ") + k.name + "=" + v;
  }
  return s;
}

std::vector<std::string> DevOverrides::names() {
  std::vector<std::string> n;
  for (const Knob& k : kKnobs) n.emplace_back(k.name);
  return n;
}

}  // namespace unimoe
