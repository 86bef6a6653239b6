// Buckets, the tuning choice's text form, candidates, keys and the tuner
// (contract: tuning.h). The JSON cache is in tuning_cache.cpp.
#include "plan/tuning.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>
#include <sstream>
#include <stdexcept>

namespace unimoe {

int token_bucket(int num_tokens) {
  if (num_tokens < 0)
    throw Error("num_tokens", "is " + std::to_string(num_tokens) + "; must be >= 0");
  int bucket = 1;
  while (bucket < num_tokens && bucket < kMaxTokenBucket) bucket *= 2;
  return bucket;
}

void check_token_bucket(int bucket) {
  if (bucket < 1 || token_bucket(bucket) != bucket)
    throw Error("bucket", std::to_string(bucket) + " is not a token bucket (a power of two up to " +
                              std::to_string(kMaxTokenBucket) + ")");
}

std::vector<int> token_buckets(int max_tokens) {
  const int last = token_bucket(max_tokens);
  std::vector<int> buckets;
  for (int b = 1; b <= last; b *= 2) buckets.push_back(b);
  return buckets;
}

// ----------------------------------------------------------------- choice ----

namespace {

// The shortest text that parses back to the same double.
std::string shortest(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

double parse_time_us(const std::string& v) {
  double t = 0;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), t);
  if (r.ec != std::errc() || r.ptr != v.data() + v.size() || !std::isfinite(t) || t < 0)
    throw Error("tuning_choice", "time_us '" + v + "' is not a finite number >= 0");
  return t;
}

}  // namespace

std::string TuningChoice::to_string() const {
  return std::string("path=") + path_name(path) + " gemm1=" + gemm1.to_string() +
         " gemm2=" + gemm2.to_string() + " sm90=" + unimoe::to_string(sm90) +
         " time_us=" + shortest(time_us);
}

TuningChoice TuningChoice::parse(const std::string& s) {
  static const char* const kKeys[] = {"path", "gemm1", "gemm2", "sm90", "time_us"};
  std::map<std::string, std::string> values;
  std::istringstream in(s);
  for (std::string pair; in >> pair;) {
    const std::size_t eq = pair.find('=');
    const std::string key = pair.substr(0, eq);
    if (eq == std::string::npos)
      throw Error("tuning_choice", "'" + pair + "' is not key=value in '" + s + "'");
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys))
      throw Error("tuning_choice",
                  "unknown key '" + key + "'; allowed: path gemm1 gemm2 sm90 time_us");
    if (!values.emplace(key, pair.substr(eq + 1)).second)
      throw Error("tuning_choice", "key '" + key + "' given twice in '" + s + "'");
  }
  for (const char* key : kKeys)
    if (values.count(key) == 0)
      throw Error("tuning_choice", "missing key '" + std::string(key) + "' in '" + s + "'");
  TuningChoice c;
  c.path = parse_experts_path(values["path"]);
  c.gemm1 = parse_gemm_tactic(values["gemm1"]);
  c.gemm2 = parse_gemm_tactic(values["gemm2"]);
  c.sm90 = parse_sm90_gemm_tactic(values["sm90"]);
  c.time_us = parse_time_us(values["time_us"]);
  check_choice_tactics(c);
  return c;
}

bool operator==(const TuningChoice& a, const TuningChoice& b) {
  return a.path == b.path && a.gemm1 == b.gemm1 && a.gemm2 == b.gemm2 && a.sm90 == b.sm90 &&
         a.time_us == b.time_us;
}

std::vector<TuningChoice> candidates_for(const MoEConfig& config, int bucket,
                                         const DeviceArch& arch, bool offer_wgmma) {
  check_token_bucket(bucket);
  const std::string& backend = config.options.backend;
  std::vector<TuningChoice> out;
  // Only backends that serve the config on this device.
  auto offered = [&](ExpertsPath p) {
    return backend_allows(backend, p) && backend_unsupported_reason(p, config, arch).empty();
  };
  const bool fp8 = config.experts.quant == QuantVariant::FP8Block128 ||
                   config.experts.quant == QuantVariant::FP8PerTensor;
  // The wgmma kernels (the BF16 wgmma tactics, FP8's mma path) are offered
  // only where asked for: on an H100 they lost to the cutlass path by
  // 1.35-2x per layer and tied it at best when offered
  // (bench/results/h100/wgmma-kernels.txt), so by default they would only
  // lengthen tuning. Elsewhere they run where forced (options.backend, the
  // mma_tactic knob).
  if (offered(ExpertsPath::Mma) && fp8 && offer_wgmma) {
    TuningChoice c;
    c.path = ExpertsPath::Mma;
    c.gemm1 = c.gemm2 = kFp8MmaTactic;
    out.push_back(c);
  }
  if (offered(ExpertsPath::Mma) && !fp8)
    for (const GemmTactic& g1 : kMmaTactics)
      for (const GemmTactic& g2 : kMmaTactics) {
        // The stream tactic is the Stream path's.
        if (g1.stream || g2.stream) continue;
        // One tile schedule serves both GEMMs, so their M tiles must agree.
        if (g1.tile_m != g2.tile_m) continue;
        if ((g1.wgmma || g2.wgmma) && !offer_wgmma) continue;
        TuningChoice c;
        c.path = ExpertsPath::Mma;
        c.gemm1 = g1;
        c.gemm2 = g2;
        out.push_back(c);
      }
  if (offered(ExpertsPath::Stream))
    for (const GemmTactic& g : kMmaTactics) {
      if (!g.stream) continue;
      TuningChoice c;
      c.path = ExpertsPath::Stream;
      c.gemm1 = c.gemm2 = g;
      out.push_back(c);
    }
  // The FP8 Cutlass path runs its own blockwise-scaled GEMM, whose tile
  // follows the call's rows per expert (backends/fp8_backends.cu), not the
  // BF16 tactic: one candidate.
  if (offered(ExpertsPath::Cutlass))
    for (Sm90GemmTactic t : kSm90GemmTactics) {
      TuningChoice c;
      c.path = ExpertsPath::Cutlass;
      c.sm90 = t;
      out.push_back(c);
      if (fp8) break;
    }
  return out;
}

// ------------------------------------------------------------------- keys ----

std::string TuningDevice::to_string() const {
  return gpu_name + " (" + std::to_string(sm_count) + " SMs, CUDA " + std::to_string(cuda_version) +
         ", unimoe " + unimoe_version + ")";
}

std::string TuningDevice::differences(const TuningDevice& other) const {
  std::string out;
  auto add = [&](bool differs, const char* what) {
    if (differs) out += (out.empty() ? "" : ", ") + std::string(what);
  };
  add(gpu_name != other.gpu_name, "GPU name");
  add(sm_count != other.sm_count, "SM count");
  add(cuda_version != other.cuda_version, "CUDA version");
  add(unimoe_version != other.unimoe_version, "unimoe version");
  return out;
}

bool operator==(const TuningDevice& a, const TuningDevice& b) { return a.differences(b).empty(); }

TuningKey TuningKey::make(const TuningDevice& device, const MoEConfig& config) {
  MoEConfig normalized = config;
  normalized.options.backend = "auto";
  return TuningKey{device, normalized.to_string()};
}

// ------------------------------------------------------------------ tuner ----

Tuner::Tuner(TimeFn time_us, RefcheckFn refcheck, ProgressFn progress)
    : time_us_(std::move(time_us)),
      refcheck_(std::move(refcheck)),
      progress_(std::move(progress)) {}

void Tuner::report(const std::string& line) const {
  if (progress_) progress_(line);
}

TuningChoice Tuner::tune(const std::vector<TuningChoice>& candidates) const {
  std::optional<TuningChoice> best;
  std::string failures;
  for (const TuningChoice& candidate : candidates) {
    TuningChoice c = candidate;
    c.time_us = 0;
    std::string why;
    try {
      if (!refcheck_(c, &why)) {
        why = "reference check failed: " + (why.empty() ? std::string("no reason given") : why);
      } else {
        const double t = time_us_(c);
        if (std::isfinite(t) && t >= 0) {
          c.time_us = t;
          report("timed " + c.to_string());
          if (!best || t < best->time_us) best = c;
          continue;
        }
        why = "timing failed: time_us " + shortest(t);
      }
    } catch (const std::exception& e) {
      // A candidate that cannot run (a launcher refusing it, say) is
      // rejected like one that runs wrong; the others are still tried.
      why = std::string("threw: ") + e.what();
    }
    report("rejected " + c.to_string() + ": " + why);
    failures += "\n  " + c.to_string() + ": " + why;
  }
  if (!best)
    throw std::runtime_error(candidates.empty() ? "tuner: no candidates"
                                                : "tuner: every candidate failed:" + failures);
  report("winner " + best->to_string());
  return *best;
}

}  // namespace unimoe
