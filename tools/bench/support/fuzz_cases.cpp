#include "support/fuzz_cases.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <set>

#include "core/ep_geometry.h"
#include "core/hash_random.h"
#include "dev/overrides.h"
#include "plan/autotune.h"
#include "plan/layer_plan.h"
#include "ref/ref.h"
#include "ref/synthetic.h"

namespace unimoe::bench {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kHuge = 3e38f;
// Weights of one layer stay small enough that the reference (which builds
// each checked token's experts on the host) keeps a case in milliseconds:
// E_local * (gemm1_cols + I) * H elements at most.
// E_local * (gemm1_cols + I) * H elements at most, and (gemm1_cols + I) * H
// per expert (a checked token builds K of them).
constexpr double kMaxWeightElements = double(1 << 27);
constexpr double kMaxExpertElements = double(1 << 22);
constexpr int kMaxTokens = 16384;
// T * E and T * H at most: the logits and x of a call.
constexpr double kMaxCallElements = double(1 << 22);

// A counter-based stream: draw i of (seed) is hash64(seed ^ hash64(i)).
class Rng {
 public:
  explicit Rng(uint64_t seed) : seed_(seed) {}
  uint64_t next() { return hash64(seed_ ^ hash64(++i_)); }
  // Uniform in [lo, hi].
  int range(int lo, int hi) { return lo + static_cast<int>(next() % uint64_t(hi - lo + 1)); }
  double unit() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  bool chance(double p) { return unit() < p; }
  // Log-uniform in [lo, hi].
  int log_range(int lo, int hi) {
    const double v = std::exp(std::log(lo) + unit() * (std::log(hi + 1.0) - std::log(lo)));
    return std::clamp(static_cast<int>(v), lo, hi);
  }
  template <typename T>
  const T& pick(const std::vector<T>& v) { return v[next() % v.size()]; }

 private:
  uint64_t seed_;
  uint64_t i_ = 0;
};

uint64_t layer_seed(uint64_t seed, int layer) { return hash64(seed ^ hash64(0x1a7e5 + uint64_t(layer))); }

bool is_deepseek(RoutingPolicy p) { return p == RoutingPolicy::DeepSeekV3 || p == RoutingPolicy::MiniMax2; }

constexpr RoutingPolicy kPolicies[] = {
    RoutingPolicy::Default, RoutingPolicy::Renormalize, RoutingPolicy::RenormalizeNaive,
    RoutingPolicy::TopK,    RoutingPolicy::Sigmoid,     RoutingPolicy::SigmoidRenorm,
    RoutingPolicy::TopKSigmoid, RoutingPolicy::Llama4, RoutingPolicy::DeepSeekV3,
    RoutingPolicy::MiniMax2};
constexpr Activation kActivations[] = {Activation::SwiGLU, Activation::GeGLU, Activation::ReLU2,
                                       Activation::SwiGLUOai};
constexpr QuantVariant kQuants[] = {QuantVariant::BF16, QuantVariant::FP8PerTensor,
                                    QuantVariant::FP8Block128, QuantVariant::MXFP4,
                                    QuantVariant::NVFP4};

// E: small and odd counts as often as the models' ones.
int draw_experts(Rng& r) {
  switch (r.range(0, 3)) {
    case 0: return r.range(1, 16);
    case 1: return r.pick(std::vector<int>{8, 16, 32, 60, 64, 128, 160, 256, 384, 512});
    case 2: return r.log_range(2, 1024);
    default: return r.pick(std::vector<int>{64, 128, 256});
  }
}

// K: mostly the models' 1..8, sometimes up to 32.
int draw_top_k(Rng& r, int limit) {
  const int k = r.chance(0.8) ? r.range(1, 8) : r.log_range(1, 32);
  return std::min(k, limit);
}

// A multiple of `m` in [m, hi], log-uniform.
int draw_multiple(Rng& r, int m, int hi) { return r.log_range(1, hi / m) * m; }

void draw_routing(Rng& r, RoutingConfig& rc) {
  rc.policy = r.pick(std::vector<RoutingPolicy>(std::begin(kPolicies), std::end(kPolicies)));
  rc.num_experts = draw_experts(r);
  const int e = rc.num_experts;
  rc.top_k = rc.policy == RoutingPolicy::Llama4 ? 1 : draw_top_k(r, e);
  if (rc.policy == RoutingPolicy::DeepSeekV3) {
    // Groups: a divisor of E with at least 2 experts each (one group too).
    std::vector<int> groups;
    for (int g = 1; g <= 16; ++g)
      if (e % g == 0 && (g == 1 || e / g >= 2)) groups.push_back(g);
    rc.n_group = r.pick(groups);
    rc.topk_group = r.range(1, std::min(rc.n_group, 8));
    const int room = rc.n_group > 1 ? std::min(22, rc.topk_group * (e / rc.n_group)) : e;
    rc.top_k = std::min(rc.top_k, room);
  }
  if (is_deepseek(rc.policy)) {
    rc.has_bias = r.chance(0.7);
    rc.routed_scaling_factor = r.pick(std::vector<float>{1.0f, 2.5f, 0.7f});
  }
  rc.logits_type = r.chance(0.5) ? LogitsType::F32 : LogitsType::BF16;
}

// The multiple H (hidden) or I must be for the GPU layer to serve variant q.
int shape_multiple(QuantVariant q, bool hidden) {
  return std::max(hidden ? hidden_multiple(q) : intermediate_multiple(q), gpu_shape_multiple(q));
}

void draw_experts_config(Rng& r, const RoutingConfig& rc, ExpertsConfig& x) {
  std::vector<QuantVariant> served;
  for (QuantVariant q : kQuants) {
    MoEConfig probe;
    probe.experts.quant = q;
    if (gpu_unsupported_reason(probe).empty()) served.push_back(q);
  }
  x.quant = r.pick(served);
  const int hm = shape_multiple(x.quant, true), im = shape_multiple(x.quant, false);
  const double h = r.unit();
  x.hidden = draw_multiple(r, hm, h < 0.8 ? 1024 : h < 0.95 ? 4096 : 7168);
  x.intermediate = draw_multiple(r, im, r.chance(0.8) ? 512 : 2048);
  x.activation = r.pick(std::vector<Activation>(std::begin(kActivations), std::end(kActivations)));
  if (x.activation == Activation::SwiGLUOai) {
    x.swiglu_alpha = 1.0f + static_cast<float>(r.unit());
    x.swiglu_limit = 1.0f + 9.0f * static_cast<float>(r.unit());
  }
  x.has_bias = r.chance(0.3);
  if (r.chance(0.25)) {  // an expert-parallel rank
    const int e = rc.num_experts;
    x.local_expert_offset = r.range(0, e - 1);
    x.num_local_experts = r.range(1, e - x.local_expert_offset);
  }
}

}  // namespace

double fuzz_error_bound(QuantVariant quant) { return 2 * reference_tolerance(quant); }

const char* to_string(FuzzLogits v) {
  switch (v) {
    case FuzzLogits::Uniform: return "uniform";
    case FuzzLogits::Skewed: return "skewed";
    case FuzzLogits::HotExpert: return "hot-expert";
    case FuzzLogits::Adversarial: return "adversarial";
  }
  return "?";
}

const char* to_string(FuzzRouting v) {
  switch (v) {
    case FuzzRouting::Logits: return "logits";
    case FuzzRouting::Precomputed: return "precomputed";
    case FuzzRouting::PrecomputedHostile: return "precomputed-hostile";
  }
  return "?";
}

FuzzLayer fuzz_layer(uint64_t seed, int layer) {
  FuzzLayer f;
  f.seed = layer_seed(seed, layer);
  Rng r(f.seed);
  MoEConfig& c = f.config;
  draw_routing(r, c.routing);
  draw_experts_config(r, c.routing, c.experts);
  // Keep the weights within the caps: halve I, then H.
  auto too_large = [&] {
    const double expert = double(c.gemm1_cols() + c.experts.intermediate) * c.experts.hidden;
    return expert > kMaxExpertElements || expert * c.local_experts() > kMaxWeightElements;
  };
  const int hm = shape_multiple(c.experts.quant, true), im = shape_multiple(c.experts.quant, false);
  while (too_large() && c.experts.intermediate > im)
    c.experts.intermediate = std::max(im, c.experts.intermediate / 2 / im * im);
  while (too_large() && c.experts.hidden > hm)
    c.experts.hidden = std::max(hm, c.experts.hidden / 2 / hm * hm);
  const double per_token = std::max(c.routing.num_experts, c.experts.hidden);
  const int cap = static_cast<int>(std::min<double>(kMaxTokens, kMaxCallElements / per_token));
  f.max_tokens = r.log_range(1, std::max(1, r.chance(0.9) ? std::min(cap, 4096) : cap));
  // Backends: auto, or one forced that serves the variant; routing variants likewise.
  const bool w4 = c.experts.quant == QuantVariant::MXFP4 || c.experts.quant == QuantVariant::NVFP4;
  // The 4-bit variants run on the stream path only.
  std::vector<std::string> backends = w4 ? std::vector<std::string>{"auto", "auto", "stream"}
                                         : std::vector<std::string>{"auto", "auto", "cutlass", "stream"};
  if (!w4) backends.push_back("mma");  // BF16's tiled kernels, FP8's wgmma kernel
  c.options.backend = r.pick(backends);
  const std::vector<std::string> variants = {"auto", "auto", "split", "fused", "cluster"};
  c.options.routing_variant = r.pick(variants);
  // From its own hash, not the stream above, so that the configs of a seed
  // stay what they were before this draw existed.
  static const char* const kGemm2Paths[] = {"auto", "combine", "gate", "gate"};
  f.gemm2_path = kGemm2Paths[hash64(f.seed ^ 0x6e22) % 4];
  // Expert parallelism, from its own hash as well. The local layers see W x
  // max_tokens tokens: max_tokens shrinks to keep that within the call cap.
  const uint64_t ep_draw = hash64(f.seed ^ 0xe9e9);
  if (ep_draw % 4 == 0 && c.experts.local_expert_offset == 0 && c.experts.num_local_experts == -1 &&
      c.experts.quant != QuantVariant::FP8PerTensor) {
    std::vector<int> worlds;
    for (int w : {2, 3, 4, 8})
      if (c.routing.num_experts % w == 0) worlds.push_back(w);
    if (!worlds.empty()) {
      f.ep_world = worlds[(ep_draw >> 8) % worlds.size()];
      f.max_tokens = std::max(1, std::min(f.max_tokens, cap / f.ep_world));
    }
  }
  // FP8PerTensor's static scales, from their own hash too.
  f.static_scales = c.experts.quant == QuantVariant::FP8PerTensor && hash64(f.seed ^ 0x5ca1) % 2 == 0;
  // The shared scratch, from its own hash too.
  f.shared_scratch = hash64(f.seed ^ 0x5c2a) % 3 == 0;
  // The decode folds, from their own hash too.
  f.decode_folds = hash64(f.seed ^ 0xf01d) % 2 == 0;
  return f;
}

int fuzz_ep_tokens(const FuzzLayer& layer, const FuzzCall& call, int rank) {
  if (rank == 0) return call.num_tokens;
  return int(hash64(call.seed ^ (0xe900 + uint64_t(rank))) % uint64_t(layer.max_tokens + 1));
}

DevOverrides fuzz_dev_overrides(const FuzzLayer& layer, DevOverrides dev) {
  if (dev.gemm2_path == DevGemm2Path::kRule) dev.set("gemm2_path=" + layer.gemm2_path);
  if (layer.decode_folds && !dev.fp8_quant_in_gemm && dev.finalize_in_gemm2 == 0) {
    dev.set("fp8_quant_in_gemm=1");
    dev.set("finalize_in_gemm2=16");
  }
  return dev;
}

FuzzCall fuzz_call(const FuzzLayer& layer, int call) {
  FuzzCall f;
  f.seed = hash64(layer.seed ^ hash64(0xca11 + uint64_t(call)));
  Rng r(f.seed);
  const int m = layer.max_tokens;
  const double u = r.unit();
  if (u < 0.08) {
    f.num_tokens = 0;
  } else if (u < 0.22) {
    f.num_tokens = 1;
  } else if (u < 0.36) {
    f.num_tokens = m;
  } else {
    f.num_tokens = r.log_range(1, m);
    if (r.chance(0.5) && f.num_tokens % 2 == 0 && f.num_tokens > 1) --f.num_tokens;  // odd
  }
  const double l = r.unit();
  f.logits = l < 0.35 ? FuzzLogits::Uniform
             : l < 0.5 ? FuzzLogits::Skewed
             : l < 0.65 ? FuzzLogits::HotExpert
                        : FuzzLogits::Adversarial;
  const double p = r.unit();
  f.routing = p < 0.7 ? FuzzRouting::Logits : p < 0.85 ? FuzzRouting::Precomputed : FuzzRouting::PrecomputedHostile;
  return f;
}

std::string describe(const FuzzLayer& layer, const FuzzCall& call) {
  return layer.config.to_string() + " max_tokens=" + std::to_string(layer.max_tokens) +
         " gemm2_path=" + layer.gemm2_path + (layer.ep_world > 0 ? " ep=" + std::to_string(layer.ep_world) : "") +
         (layer.static_scales ? " static_scales" : "") +
         (layer.shared_scratch ? " shared_scratch" : "") +
         (layer.decode_folds ? " decode_folds" : "") +
         " T=" + std::to_string(call.num_tokens) + " logits=" + to_string(call.logits) +
         " routing=" + to_string(call.routing);
}

std::string case_id(uint64_t seed, int layer, int call) {
  return std::to_string(seed) + ":" + std::to_string(layer) + ":" + std::to_string(call);
}

void parse_case_id(const std::string& s, uint64_t& seed, int& layer, int& call) {
  const std::size_t a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
  bool ok = b != std::string::npos;
  try {
    if (ok) {
      std::size_t used = 0;
      seed = std::stoull(s.substr(0, a), &used);
      ok = used == a;
      layer = std::stoi(s.substr(a + 1, b - a - 1), &used);
      ok = ok && used == b - a - 1;
      call = std::stoi(s.substr(b + 1), &used);
      ok = ok && used == s.size() - b - 1;
    }
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok || layer < 0 || call < 0 || call >= kFuzzCallsPerLayer)
    throw Error("fuzz-case", "'" + s + "' is not SEED:LAYER:CALL (CALL 0.." +
                                 std::to_string(kFuzzCallsPerLayer - 1) + "), as a failure prints it");
}

bool is_adversarial_row(const FuzzLayer& layer, const FuzzCall& call, int token) {
  if (call.logits != FuzzLogits::Adversarial || token < 0 || token >= call.num_tokens) return false;
  // Every row with probability 1/4, and row T / 2 always.
  (void)layer;
  return token == call.num_tokens / 2 || hash64(call.seed ^ hash64(0xad0 + uint64_t(token))) % 4 == 0;
}

std::vector<float> fuzz_logits(const FuzzLayer& layer, const FuzzCall& call) {
  const MoEConfig& c = layer.config;
  const int e = c.routing.num_experts, t = call.num_tokens;
  std::vector<float> x = ref::make_logits(c, t, call.seed ^ 0x10917,
                                          call.logits == FuzzLogits::Skewed ? "skewed" : "uniform");
  Rng r(call.seed ^ 0x5eed);
  if (call.logits == FuzzLogits::HotExpert) {
    const int hot = r.range(0, e - 1);
    for (int i = 0; i < t; ++i) x[std::size_t(i) * e + hot] += 8.0f;
  }
  if (call.logits != FuzzLogits::Adversarial) return x;
  // TopK's weights are the logits themselves: only rows whose K best stay
  // ordinary numbers (equal values; one NaN or -inf where E > K).
  const bool raw_weights = c.routing.policy == RoutingPolicy::TopK;
  const bool spare = e > c.routing.top_k;
  for (int i = 0; i < t; ++i) {
    if (!is_adversarial_row(layer, call, i)) continue;
    float* row = x.data() + std::size_t(i) * e;
    const int kind = raw_weights ? (spare ? r.range(0, 2) : 0) : r.range(0, 9);
    const int a = r.range(0, e - 1), b = r.range(0, e - 1);
    switch (kind) {
      case 0: std::fill(row, row + e, static_cast<float>(r.range(-3, 3))); break;  // all equal
      case 1: row[a] = kNaN; break;                                              // one NaN
      case 2: row[a] = -kInf; break;                                             // one -inf
      case 3: std::fill(row, row + e, kNaN); break;                              // all NaN
      case 4: std::fill(row, row + e, -kInf); break;                             // all -inf
      case 5: row[a] = kInf; break;                                              // one +inf
      case 6: row[a] = kInf; row[b] = kInf; break;                               // two +inf (or one)
      case 7: row[a] = kHuge; row[b] = -kHuge; break;                            // +-3e38
      case 8:                                                                    // a mix
        for (int j = 0; j < e; ++j) {
          const int m = r.range(0, 5);
          if (m == 0) row[j] = kNaN;
          if (m == 1) row[j] = -kInf;
          if (m == 2) row[j] = kHuge;
        }
        break;
      default: std::fill(row, row + e, kHuge); break;  // all +3e38: equal
    }
  }
  return x;
}

FuzzPrecomputed fuzz_precomputed(const FuzzLayer& layer, const FuzzCall& call) {
  const RoutingConfig& rc = layer.config.routing;
  const int e = rc.num_experts, k = rc.top_k, t = call.num_tokens;
  FuzzPrecomputed p;
  p.ids.resize(std::size_t(t) * k);
  p.weights.resize(p.ids.size());
  Rng r(call.seed ^ 0x9e1d);
  const bool hostile = call.routing == FuzzRouting::PrecomputedHostile;
  for (int i = 0; i < t; ++i) {
    int32_t* ids = p.ids.data() + std::size_t(i) * k;
    float* w = p.weights.data() + std::size_t(i) * k;
    for (int j = 0; j < k; ++j) {  // K distinct ids
      int id;
      do id = r.range(0, e - 1);
      while (std::find(ids, ids + j, id) != ids + j);
      ids[j] = id;
      w[j] = 0.05f + 0.95f * static_cast<float>(r.unit());
    }
    if (!hostile) continue;
    for (int j = 0; j < k; ++j) {
      if (r.chance(0.15)) w[j] = -w[j];
      if (!r.chance(0.2)) continue;
      const int kind = r.range(0, kHostileIdKinds - 1);
      ++p.hostile_ids[kind];
      switch (static_cast<HostileId>(kind)) {
        case HostileId::MinusOne: ids[j] = -1; break;
        case HostileId::NumExperts: ids[j] = e; break;
        case HostileId::PastEnd: ids[j] = e + r.range(1, 1000); break;
        case HostileId::IntMax: ids[j] = INT32_MAX; break;
        case HostileId::IntMin: ids[j] = INT32_MIN; break;
        case HostileId::Repeat: ids[j] = ids[r.range(0, k - 1)]; break;
      }
    }
  }
  if (hostile && t > 0 && r.chance(0.5)) {
    p.nan_token = r.range(0, t - 1);
    p.weights[std::size_t(p.nan_token) * k + r.range(0, k - 1)] = kNaN;
  }
  return p;
}

std::vector<int> fuzz_check_tokens(const FuzzLayer& layer, const FuzzCall& call) {
  const int t = call.num_tokens;
  if (t == 0) return {};
  Rng r(call.seed ^ 0xc4ec);
  int special = r.range(0, t - 1);
  if (call.logits == FuzzLogits::Adversarial && call.routing == FuzzRouting::Logits) special = t / 2;
  if (call.routing == FuzzRouting::PrecomputedHostile) {
    const int nan_token = fuzz_precomputed(layer, call).nan_token;
    if (nan_token >= 0) special = nan_token;
  }
  std::set<int> tokens = {0, t - 1, special};
  return {tokens.begin(), tokens.end()};
}

FuzzPlanSummary run_fuzz_planning(uint64_t seed, int first_layer, int layers) {
  FuzzPlanSummary s;
  const DeviceArch hopper{9, 0, 132};
  RoutingDeviceCaps wide;
  wide.sm_count = 132;
  wide.cluster_runs_16[0] = wide.cluster_runs_16[1] = true;
  wide.spread_runs_16[0] = wide.spread_runs_16[1] = true;
  RoutingDeviceCaps narrow;
  narrow.sm_count = 114;
  for (int l = first_layer; l < first_layer + layers; ++l) {
    const FuzzLayer layer = fuzz_layer(seed, l);
    const MoEConfig& c = layer.config;
    const DevOverrides dev = fuzz_dev_overrides(layer, DevOverrides{});
    auto fail = [&](int call, const std::string& what) {
      s.failures.push_back({case_id(seed, l, call), what + " [" + c.to_string() + "]"});
    };
    try {
      validate(c);
    } catch (const std::exception& e) {
      fail(0, std::string("invalid config: ") + e.what());
      continue;
    }
    if (const std::string why = gpu_unsupported_reason(c); !why.empty()) fail(0, "GPU layer refuses: " + why);
    if (c.options.backend != "auto") {
      const std::string why = backend_unsupported_reason(parse_experts_path(c.options.backend), c, hopper);
      if (!why.empty()) fail(0, "forced backend refuses: " + why);
    }
    if (layer.ep_world > 0) {
      try {
        for (int r = 0; r < layer.ep_world; ++r) plan_ep(c, layer.max_tokens, r, layer.ep_world);
      } catch (const std::exception& e) {
        fail(0, std::string("plan_ep refuses: ") + e.what());
      }
    }
    const std::vector<float> bias = ref::host_bias(c, ref::seeds_for(layer.seed));
    for (int k = 0; k < kFuzzCallsPerLayer; ++k) {
      ++s.cases;
      const FuzzCall call = fuzz_call(layer, k);
      const int t = call.num_tokens;
      if (t < 0 || t > layer.max_tokens) fail(k, "T outside 0..max_tokens");
      const bool precomputed = call.routing != FuzzRouting::Logits;
      try {
        for (const RoutingDeviceCaps& caps : {wide, narrow}) {
          const LayerPlan plan = plan_layer(c, t, precomputed, caps, dev);
          if (!backend_allows(c.options.backend, plan.path)) fail(k, "plan takes a path the backend forbids");
        }
      } catch (const std::exception& e) {
        fail(k, std::string("plan_layer threw: ") + e.what());
      }
      const std::vector<int> check = fuzz_check_tokens(layer, call);
      if (precomputed) {
        // The reference takes any ids: out-of-range ones count nowhere.
        const FuzzPrecomputed p = fuzz_precomputed(layer, call);
        try {
          const ref::Permutation perm = ref::permute(p.ids.data(), t, c.routing.top_k,
                                                     c.experts.local_expert_offset, c.local_experts());
          long in_range = 0;
          for (int32_t id : p.ids)
            in_range += id >= c.experts.local_expert_offset &&
                        id < c.experts.local_expert_offset + c.local_experts();
          if (perm.expert_offsets.back() != in_range) fail(k, "reference permute lost rows");
        } catch (const std::exception& e) {
          fail(k, std::string("reference permute threw: ") + e.what());
        }
        continue;
      }
      const std::vector<float> logits =
          ref::device_logits(fuzz_logits(layer, call), c.routing.logits_type).values;
      const int e = c.routing.num_experts;
      std::vector<float> rows;
      for (int token : check) rows.insert(rows.end(), logits.begin() + std::size_t(token) * e,
                                          logits.begin() + std::size_t(token + 1) * e);
      const ref::Routing routing = ref::route(c.routing, rows.data(), static_cast<int>(check.size()),
                                              c.routing.has_bias ? bias.data() : nullptr);
      for (std::size_t i = 0; i < check.size(); ++i) {
        const int kk = c.routing.top_k;
        std::set<int> seen;
        for (int j = 0; j < kk; ++j) {
          const int id = routing.ids[i * kk + j];
          if (id < 0 || id >= e || !seen.insert(id).second) fail(k, "reference ids not K distinct experts");
          if (!std::isfinite(routing.weights[i * kk + j])) fail(k, "reference weight not finite");
        }
      }
    }
  }
  return s;
}

}  // namespace unimoe::bench
