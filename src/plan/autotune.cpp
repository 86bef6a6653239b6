#include "plan/autotune.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "plan/tuning.h"
#include "ref/ref.h"
#include "ref/synthetic.h"

namespace unimoe {

bool operator==(const AutotuneTarget& a, const AutotuneTarget& b) {
  return a.bucket == b.bucket && a.num_tokens == b.num_tokens;
}

void check_autotune_options(const AutotuneOptions& o, int max_tokens) {
  for (int t : o.tokens)
    if (t < 1 || t > max_tokens)
      throw Error("autotune.tokens", "holds " + std::to_string(t) + "; allowed: 1.." +
                                         std::to_string(max_tokens) + " (the layer's max_tokens)");
  ref::check_routing_distribution(o.routing, "autotune.routing");
  if (o.iters < 1) throw Error("autotune.iters", "is " + std::to_string(o.iters) + "; must be >= 1");
  if (o.check_tokens < 1)
    throw Error("autotune.check_tokens", "is " + std::to_string(o.check_tokens) +
                                             "; must be >= 1 (every candidate is checked against the CPU reference)");
}

std::vector<AutotuneTarget> autotune_targets(const AutotuneOptions& o, int max_tokens) {
  check_autotune_options(o, max_tokens);
  std::map<int, int> tokens_of;  // bucket -> largest count listed for it
  if (o.tokens.empty()) {
    for (int b : token_buckets(max_tokens)) tokens_of[b] = std::min(b, max_tokens);
  } else {
    for (int t : o.tokens) {
      int& n = tokens_of[token_bucket(t)];
      n = std::max(n, t);
    }
  }
  std::vector<AutotuneTarget> targets;
  for (const auto& [bucket, t] : tokens_of) targets.push_back({bucket, t});
  return targets;
}

double reference_tolerance(QuantVariant quant) {
  switch (quant) {
    case QuantVariant::BF16: return kTuningTolerance;
    case QuantVariant::FP8PerTensor:
    case QuantVariant::FP8Block128: return kFp8Tolerance;
    // W4A16: the kernels dequantize the weights exactly and keep bf16
    // activations, so only accumulation order and bf16 rounding differ, as
    // for BF16.
    case QuantVariant::MXFP4:
    case QuantVariant::NVFP4: return kTuningTolerance;
  }
  return kTuningTolerance;
}

double relative_l2_error(const std::vector<uint16_t>& got_bits, const std::vector<float>& want) {
  if (got_bits.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t j = 0; j < want.size(); ++j) {
    const double d = ref::bf16_to_f32(got_bits[j]) - static_cast<double>(want[j]);
    num += d * d;
    den += static_cast<double>(want[j]) * want[j];
  }
  const double err = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0);
  return std::isnan(err) ? INFINITY : err;
}

}  // namespace unimoe
