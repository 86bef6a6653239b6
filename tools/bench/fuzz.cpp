// unimoe-bench --fuzz: random valid layers and calls (support/fuzz_cases.h)
// run on the GPU through the public API and checked against the CPU
// reference. Per call:
//   - the checked tokens' output rows equal the reference's (relative L2
//     within the quant variant's bound, plus the reference's flip allowance
//     for FP8's near ties (wider on the FP8 wgmma paths, whose GEMM1 sums
//     are coarser than fp32); non-finite exactly where the reference is
//     non-finite);
//   - every row of the call is finite, except the token a hostile call gave
//     a NaN weight;
//   - rows T..max_tokens of the poisoned output are untouched;
//   - a CUDA-graph replay of the call gives the eager output bit for bit.
// A failure prints one line with the case id that --fuzz-case reruns.
// Without a GPU it runs the planning slice (run_fuzz_planning) and says so.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "bench.h"
#include "json_file.h"
#include "support/fuzz_cases.h"
#include "support/reference_check.h"

#if defined(UNIMOE_WITH_CUDA)

#include <cuda_runtime.h>

#include <cstring>
#include <memory>

#include "core/hash_random.h"
#include "kernels/common/common.cuh"
#include "kernels/common/fill.cuh"
#include "layer/ep_layer.h"
#include "layer/graph_timing.h"
#include "layer/layer_access.h"
#include "layer/moe_layer.h"
#include "plan/autotune.h"
#include "ref/ref.h"
#include "ref/synthetic.h"
#include "support/device_weights.h"
#include "unimoe/ep.h"

#endif

namespace unimoe::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

constexpr std::size_t kWorstKept = 10;

struct Failure {
  std::string id, what, describe;
};

void report(const FuzzOptions& opt, uint64_t seed, const std::string& mode, const std::string& device, int cases,
            const std::vector<Failure>& failures, double seconds,
            const std::map<std::string, std::map<std::string, int>>& coverage,
            const std::set<std::pair<double, std::string>>& worst) {
  nlohmann::json doc;
  doc["tool"] = "unimoe-bench --fuzz";
  doc["version"] = kVersion;
  doc["mode"] = mode;
  doc["device"] = device;
  doc["seed"] = seed;
  doc["cases"] = cases;
  doc["seconds"] = seconds;
  doc["failures"] = nlohmann::json::array();
  for (const Failure& f : failures)
    doc["failures"].push_back({{"case", f.id}, {"what", f.what}, {"config", f.describe}});
  doc["coverage"] = coverage;
  doc["largest_errors"] = nlohmann::json::array();
  for (auto it = worst.rbegin(); it != worst.rend(); ++it)
    doc["largest_errors"].push_back({{"case", it->second}, {"rel_err", it->first}});
  write_json_file(doc, opt.json_path);
  if (!coverage.empty()) std::printf("coverage (calls):\n");
  for (const auto& [dimension, counts] : coverage) {
    std::printf("  %-14s", dimension.c_str());
    for (const auto& [value, n] : counts) std::printf(" %s=%d", value.c_str(), n);
    std::printf("\n");
  }
  if (!worst.empty())
    std::printf("largest checked error: %.3e (case %s)\n", worst.rbegin()->first, worst.rbegin()->second.c_str());
  std::printf("fuzz %s on %s: %d cases, %zu failed, %.1f s (seed %llu); wrote %s\n", mode.c_str(),
              device.c_str(), cases, failures.size(), seconds,
              static_cast<unsigned long long>(seed), opt.json_path.c_str());
}

// The cases to run: every call of layers 0.. up to opt.cases, or one case.
struct CaseRange {
  int first_layer = 0, layers = 0, only_call = -1;
};
CaseRange case_range(const FuzzOptions& opt, uint64_t& seed) {
  CaseRange r;
  seed = opt.seed;
  if (!opt.only_case.empty()) {
    parse_case_id(opt.only_case, seed, r.first_layer, r.only_call);
    r.layers = 1;
  } else {
    r.layers = (opt.cases + kFuzzCallsPerLayer - 1) / kFuzzCallsPerLayer;
  }
  return r;
}

int run_planning_slice(const FuzzOptions& opt, const std::string& why) {
  const auto t0 = Clock::now();
  uint64_t seed;
  const CaseRange r = case_range(opt, seed);
  std::printf("NOTE: no GPU (%s): ran the planning slice only (validation, plans, reference routing)\n",
              why.c_str());
  const FuzzPlanSummary s = run_fuzz_planning(seed, r.first_layer, r.layers);
  std::vector<Failure> failures;
  for (const FuzzPlanFailure& f : s.failures) {
    failures.push_back({f.id, f.what, ""});
    std::printf("FAILED %s: %s\n  reproduce: unimoe-bench --fuzz-case %s\n", f.id.c_str(), f.what.c_str(),
                f.id.c_str());
  }
  report(opt, seed, "planning", "cpu", s.cases, failures, seconds_since(t0), {}, {});
  return failures.empty() ? 0 : 1;
}

#if defined(UNIMOE_WITH_CUDA)

// "routing=cluster kernel=block ctas=1 ..." -> "routing=cluster kernel=block".
std::string first_words(const std::string& s, int n) {
  std::size_t end = 0;
  for (int i = 0; i < n && end != std::string::npos; ++i) end = s.find(' ', end + (i > 0));
  return s.substr(0, end);
}

bool finite_bf16(uint16_t bits) { return (bits & 0x7f80u) != 0x7f80u; }
constexpr uint16_t kPoison = 0xffff;  // the bytes 0xff: a NaN

// The reference check of the checked tokens' rows: non-finite exactly where
// the reference is, relative L2 over the rest within `bound`. Empty: passed.
std::string compare_rows(const std::vector<uint16_t>& got, const std::vector<float>& want, double bound,
                         double* err_out) {
  std::vector<uint16_t> got_finite;
  std::vector<float> want_finite;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const bool want_ok = std::isfinite(want[i]), got_ok = finite_bf16(got[i]);
    if (want_ok != got_ok)
      return "element " + std::to_string(i) + " is " + (got_ok ? "finite" : "not finite") +
             " on the GPU, the reference's is " + (want_ok ? "finite" : "not");
    if (want_ok) {
      got_finite.push_back(got[i]);
      want_finite.push_back(want[i]);
    }
  }
  const double err = relative_l2_error(got_finite, want_finite);
  *err_out = err;
  if (err <= bound) return "";
  return "relative L2 error " + std::to_string(err) + " over the bound " + std::to_string(bound);
}

// One fuzzed layer on the device: weights filled once, buffers for max_tokens.
class FuzzRig {
 public:
  FuzzRig(const FuzzLayer& layer, cudaStream_t stream)
      : layer_(layer), c_(layer.config), seeds_(ref::seeds_for(layer.seed)), host_(c_, seeds_),
        stream_(stream), ranks_(std::max(1, layer.ep_world)) {
    const std::size_t h = c_.experts.hidden, m = layer.max_tokens, k = c_.routing.top_k;
    const std::size_t experts = c_.routing.num_experts;
    expert_weights_ =
        std::make_unique<SyntheticDeviceWeights>(c_, seeds_, stream, layer.static_scales);
    bias_ = std::make_unique<DeviceMem>(experts * 4);
    x_ = std::make_unique<DeviceMem>(m * h * 2);
    logits_ = std::make_unique<DeviceMem>(m * experts * 4);
    ids_ = std::make_unique<DeviceMem>(m * k * 4);
    weights_ = std::make_unique<DeviceMem>(m * k * 4);
    // One output (and replay) block of max_tokens rows a rank.
    out_ = std::make_unique<DeviceMem>(ranks_ * m * h * 2);
    replay_ = std::make_unique<DeviceMem>(ranks_ * m * h * 2);
    host_bias_ = ref::host_bias(c_, seeds_);
    UNIMOE_CUDA_CHECK(cudaMemcpyAsync(bias_->p, host_bias_.data(), experts * 4, cudaMemcpyHostToDevice, stream));
    const DevOverrides dev = fuzz_dev_overrides(layer, DevOverrides::from_environment());
    if (layer.shared_scratch) {
      scratch_bytes_ = layer.ep_world == 0
                           ? MoELayer::scratch_bytes(c_, layer.max_tokens)
                           : EPLayer::scratch_bytes(c_, layer.max_tokens, layer.ep_world);
      for (int r = 0; r < ranks_; ++r) scratch_.push_back(std::make_unique<DeviceMem>(scratch_bytes_));
    }
    if (layer.ep_world == 0) {
      layer_ptr_ = layer.shared_scratch
                       ? layer_access::create(c_, layer.max_tokens, dev, scratch_[0]->p, scratch_bytes_)
                       : layer_access::create(c_, layer.max_tokens, dev);
      layer_ptr_->set_weights(expert_weights_->weights());
      return;
    }
    // Every rank over the loopback, with its slice of the same weights.
    transports_ = make_loopback_transports(layer.ep_world);
    const int per_rank = int(experts) / layer.ep_world;
    for (int r = 0; r < layer.ep_world; ++r) {
      ep_.push_back(layer.shared_scratch
                        ? ep_access::create(c_, layer.max_tokens, *transports_[r], dev, scratch_[r]->p,
                                            scratch_bytes_)
                        : ep_access::create(c_, layer.max_tokens, *transports_[r], dev));
      ep_.back()->set_weights(slice_experts(expert_weights_->weights(), c_, r * per_rank, per_rank));
    }
  }

  // Runs one call; returns "" when every check passes, else what failed.
  // err: the checked rows' relative L2 error (-1 where none was checked).
  // An EP layer's rank r passes the first fuzz_ep_tokens(r) tokens of the
  // same inputs; every rank's rows are checked.
  std::string run(const FuzzCall& call, std::map<std::string, std::map<std::string, int>>& coverage,
                  double* err) {
    const int t = call.num_tokens, h = c_.experts.hidden, k = c_.routing.top_k;
    const std::size_t m = layer_.max_tokens;
    const uint64_t x_seed = hash64(call.seed ^ 0x78);
    const bool precomputed = call.routing != FuzzRouting::Logits;
    std::vector<int> tokens(ranks_);
    for (int r = 0; r < ranks_; ++r) tokens[r] = fuzz_ep_tokens(layer_, call, r);
    const int t_all = *std::max_element(tokens.begin(), tokens.end());
    // Inputs for the most tokens any rank passes; a larger call draws the
    // same first rows (the draws are per token).
    FuzzCall widest = call;
    widest.num_tokens = t_all;
    launch_fill_bf16(x_->as<uint16_t>(), std::size_t(t_all) * h, x_seed, ref::kXScale, stream_);
    const ref::DeviceLogits logits = ref::device_logits(fuzz_logits(layer_, widest), c_.routing.logits_type);
    FuzzPrecomputed pre;
    if (precomputed) pre = fuzz_precomputed(layer_, widest);
    // Pageable copies: the host vectors may go once these return.
    UNIMOE_CUDA_CHECK(cudaMemcpyAsync(logits_->p, logits.bytes.data(), logits.bytes.size(),
                                      cudaMemcpyHostToDevice, stream_));
    if (precomputed && t_all > 0) {
      UNIMOE_CUDA_CHECK(cudaMemcpyAsync(ids_->p, pre.ids.data(), pre.ids.size() * 4, cudaMemcpyHostToDevice, stream_));
      UNIMOE_CUDA_CHECK(cudaMemcpyAsync(weights_->p, pre.weights.data(), pre.weights.size() * 4,
                                        cudaMemcpyHostToDevice, stream_));
    }
    UNIMOE_CUDA_CHECK(cudaMemsetAsync(out_->p, 0xff, ranks_ * m * h * 2, stream_));
    UNIMOE_CUDA_CHECK(cudaMemsetAsync(replay_->p, 0xff, ranks_ * m * h * 2, stream_));
    auto args = [&](int r, void* out) {
      ForwardArgs a;
      a.num_tokens = tokens[r];
      a.x = x_->p;
      a.logits = logits_->p;  // ignored where ids and weights are given
      a.routing_bias = c_.routing.has_bias ? bias_->as<float>() : nullptr;
      if (precomputed) {
        a.topk_ids = ids_->as<int32_t>();
        a.topk_weights = weights_->as<float>();
      }
      a.out = static_cast<uint16_t*>(out) + r * m * h;
      return a;
    };
    auto forward = [&](void* out) {
      if (ep_.empty()) {
        layer_ptr_->forward(args(0, out), stream_);
        return;
      }
      for (EPLayer::Step step : kEPSteps)
        for (int r = 0; r < ranks_; ++r) ep_[r]->run_step(step, args(r, out), stream_);
    };
    // What another layer's calls would leave in a shared scratch.
    auto spoil_scratch = [&] {
      for (const auto& s : scratch_) UNIMOE_CUDA_CHECK(cudaMemsetAsync(s->p, 0xff, scratch_bytes_, stream_));
    };
    spoil_scratch();
    forward(out_->p);
    cudaGraphExec_t g = capture(stream_, [&] { forward(replay_->p); });
    spoil_scratch();
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(g, stream_));
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    cudaGraphExecDestroy(g);

    const MoELayerImpl& served = ep_.empty() ? layer_access::impl(*layer_ptr_)
                                             : layer_access::impl(ep_[0]->local_layer());
    const LayerPlan plan = ep_.empty() ? served.plan_for(t, precomputed)
                                       : served.plan_for(ranks_ * int(m), true);
    coverage["path"][path_name(plan.path)]++;
    coverage["routing_kernel"][first_words(plan.routing.to_string(), 2)]++;
    coverage["policy"][to_string(c_.routing.policy)]++;
    coverage["logits"][to_string(call.logits)]++;
    coverage["routing"][to_string(call.routing)]++;
    coverage["activation"][to_string(c_.experts.activation)]++;
    coverage["quant"][to_string(c_.experts.quant) + (layer_.static_scales ? " static" : "")]++;
    coverage["buffers"][layer_.shared_scratch ? "shared scratch" : "own"]++;
    coverage["gemm2"][gemm2_mode_name(plan.gemm2_mode)]++;
    coverage["decode_folds"][plan.finalize_in_gemm2 ? (plan.fp8_quant_in_gemm ? "quantize and finalize"
                                                                              : "finalize")
                                                    : "none"]++;
    coverage["T"][t == 0 ? "0" : t == 1 ? "1" : t == layer_.max_tokens ? "max" : t % 2 ? "odd" : "even"]++;
    coverage["ep"][ep_.empty() ? "off" : "W=" + std::to_string(ranks_)]++;

    std::vector<uint16_t> out(ranks_ * m * h), replay(ranks_ * m * h);
    UNIMOE_CUDA_CHECK(cudaMemcpy(out.data(), out_->p, out.size() * 2, cudaMemcpyDeviceToHost));
    UNIMOE_CUDA_CHECK(cudaMemcpy(replay.data(), replay_->p, replay.size() * 2, cudaMemcpyDeviceToHost));
    for (int r = 0; r < ranks_; ++r) {
      const std::string who = ep_.empty() ? "" : "rank " + std::to_string(r) + ": ";
      const std::size_t first = r * m * h, used = std::size_t(tokens[r]) * h;
      for (std::size_t i = first + used; i < first + m * h; ++i)
        if (out[i] != kPoison || replay[i] != kPoison)
          return who + "wrote row " + std::to_string((i - first) / h) + " past T = " + std::to_string(tokens[r]);
      if (std::memcmp(out.data() + first, replay.data() + first, used * 2) != 0)
        return who + "graph replay differs from the eager forward";
      for (std::size_t i = 0; i < used; ++i)
        if (!finite_bf16(out[first + i]) && static_cast<int>(i / h) != pre.nan_token)
          return who + "row " + std::to_string(i / h) + " not finite";
    }

    // The checked tokens of the widest call; each rank compares those it passed.
    const std::vector<int> check = fuzz_check_tokens(layer_, widest);
    if (check.empty()) return "";
    ref::Routing routing;
    routing.num_tokens = static_cast<int>(check.size());
    routing.top_k = k;
    if (precomputed) {
      for (int token : check) {
        routing.ids.insert(routing.ids.end(), pre.ids.begin() + std::size_t(token) * k,
                           pre.ids.begin() + std::size_t(token + 1) * k);
        routing.weights.insert(routing.weights.end(), pre.weights.begin() + std::size_t(token) * k,
                               pre.weights.begin() + std::size_t(token + 1) * k);
      }
    } else {
      const int e = c_.routing.num_experts;
      std::vector<float> rows;
      for (int token : check)
        rows.insert(rows.end(), logits.values.begin() + std::size_t(token) * e,
                    logits.values.begin() + std::size_t(token + 1) * e);
      routing = ref::route(c_.routing, rows.data(), routing.num_tokens,
                           c_.routing.has_bias ? host_bias_.data() : nullptr);
    }
    const std::vector<float> x = ref::host_x_rows(c_, check, x_seed);
    // FP8PerTensor's dynamic scales are one amax over all T tokens: the
    // reference of the checked tokens takes the ones the forward computed
    // (EP layers never have FP8PerTensor).
    ref::ActivationScales scales = expert_weights_->static_scales();
    if (c_.experts.quant == QuantVariant::FP8PerTensor && scales.x == 0.0f)
      scales = layer_access::impl(*layer_ptr_).dynamic_activation_scales(t, precomputed);
    // Wider on the FP8 wgmma paths, whose GEMM1 sums are coarser than fp32.
    double allowance = 0.0;
    const std::vector<float> want = ref::moe_forward(c_, host_.source(), x.data(), routing, 0,
                                                     scales, &allowance, gemm1_sum_precision(plan));
    // The intermediate's near ties (FP8) may move the output by that much
    // more than the bound: relative to the reference rows' finite norm.
    const double tie_bound = ref::relative_flip_allowance(allowance, want);
    std::vector<uint16_t> got;
    std::vector<float> wanted;
    for (int r = 0; r < ranks_; ++r)
      for (std::size_t j = 0; j < check.size(); ++j) {
        if (check[j] >= tokens[r]) continue;
        const auto row = out.begin() + r * m * h + std::size_t(check[j]) * h;
        got.insert(got.end(), row, row + h);
        wanted.insert(wanted.end(), want.begin() + j * h, want.begin() + (j + 1) * h);
      }
    if (got.empty()) return "";
    return compare_rows(got, wanted, fuzz_error_bound(c_.experts.quant) + tie_bound, err);
  }

 private:
  const FuzzLayer& layer_;
  const MoEConfig& c_;
  ref::Seeds seeds_;
  ref::HostWeights host_;
  cudaStream_t stream_;
  int ranks_;  // 1, or the EP layer's W
  std::vector<float> host_bias_;
  std::unique_ptr<SyntheticDeviceWeights> expert_weights_;
  std::unique_ptr<DeviceMem> bias_, x_, logits_, ids_, weights_, out_, replay_;
  // shared_scratch: one buffer a rank, before the layers that use it.
  std::vector<std::unique_ptr<DeviceMem>> scratch_;
  std::size_t scratch_bytes_ = 0;
  std::unique_ptr<MoELayer> layer_ptr_;
  std::vector<std::unique_ptr<EPTransport>> transports_;
  std::vector<std::unique_ptr<EPLayer>> ep_;
};

int run_gpu_fuzz(const FuzzOptions& opt) {
  const auto t0 = Clock::now();
  uint64_t seed;
  const CaseRange r = case_range(opt, seed);
  cudaDeviceProp prop{};
  UNIMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<Failure> failures;
  std::map<std::string, std::map<std::string, int>> coverage;
  std::set<std::pair<double, std::string>> worst;  // the largest errors checked
  int cases = 0;
  for (int l = r.first_layer; l < r.first_layer + r.layers; ++l) {
    const FuzzLayer layer = fuzz_layer(seed, l);
    std::unique_ptr<FuzzRig> rig;
    auto fail = [&](int call, const std::string& what) {
      Failure f{case_id(seed, l, call), what, describe(layer, fuzz_call(layer, call))};
      std::printf("FAILED %s: %s\n  reproduce: unimoe-bench --fuzz-case %s\n  case: %s\n", f.id.c_str(),
                  f.what.c_str(), f.id.c_str(), f.describe.c_str());
      std::fflush(stdout);
      failures.push_back(f);
    };
    try {
      rig = std::make_unique<FuzzRig>(layer, stream);
    } catch (const std::exception& e) {
      fail(0, std::string("layer creation failed: ") + e.what());
      continue;
    }
    for (int call = 0; call < kFuzzCallsPerLayer; ++call) {
      if (r.only_call >= 0 && call != r.only_call) continue;
      if (r.only_call < 0 && cases >= opt.cases) break;
      ++cases;
      std::string what;
      double err = -1;
      try {
        what = rig->run(fuzz_call(layer, call), coverage, &err);
      } catch (const std::exception& e) {
        what = std::string("threw: ") + e.what();
      }
      if (err >= 0) {
        worst.insert({err, case_id(seed, l, call)});
        if (worst.size() > kWorstKept) worst.erase(worst.begin());
      }
      if (what.empty()) continue;
      fail(call, what);
      // A device fault leaves the context unusable: stop with what we have.
      if (cudaDeviceSynchronize() != cudaSuccess) {
        std::printf("the device faulted; stopping\n");
        report(opt, seed, "gpu", prop.name, cases, failures, seconds_since(t0), coverage, worst);
        return 1;
      }
    }
    if (opt.progress_every > 0 && (l + 1) % opt.progress_every == 0)
      std::fprintf(stderr, "  %d cases, %zu failed, %.0f s\n", cases, failures.size(), seconds_since(t0));
  }
  cudaStreamDestroy(stream);
  report(opt, seed, "gpu", prop.name, cases, failures, seconds_since(t0), coverage, worst);
  return failures.empty() ? 0 : 1;
}

#endif

}  // namespace

int run_fuzz(const FuzzOptions& opt) {
  std::string why = "--cpu given";
  if (!opt.force_cpu && gpu_available(&why)) {
#if defined(UNIMOE_WITH_CUDA)
    return run_gpu_fuzz(opt);
#endif
  }
  return run_planning_slice(opt, why);
}

}  // namespace unimoe::bench
