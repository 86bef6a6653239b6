// The reference routing: logits -> (expert ids, weights) for every policy,
// the oracle the routing kernels are compared against id for id. The
// formulas and the rules for ties, NaN and infinities are in docs/routing.md;
// this file follows that text line by line.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "core/sigmoid_fp32.h"
#include "ref/ref.h"

namespace unimoe::ref {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kDeepSeekEpsilon = 1e-20;

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

std::string str(int64_t v) { return std::to_string(v); }

bool is_deepseek(RoutingPolicy p) {
  return p == RoutingPolicy::DeepSeekV3 || p == RoutingPolicy::MiniMax2;
}

// Only what route() needs to be well defined; validate() holds the full rules.
void check_arguments(const RoutingConfig& c, const float* logits, int num_tokens,
                     const float* bias) {
  const int e = c.num_experts, k = c.top_k;
  require(num_tokens >= 0, "route: num_tokens is " + str(num_tokens) + "; must be >= 0");
  require(e >= 1, "route: num_experts is " + str(e) + "; must be >= 1");
  require(k >= 1 && k <= e,
          "route: top_k is " + str(k) + "; allowed: 1..num_experts (" + str(e) + ")");
  require(num_tokens == 0 || logits != nullptr, "route: logits is null");
  require(c.policy != RoutingPolicy::Llama4 || k == 1, "route: Llama4 needs top_k = 1");
  require(c.policy != RoutingPolicy::DeepSeekV3 || c.n_group >= 1,
          "route: n_group is " + str(c.n_group) + "; must be >= 1");
  if (c.policy == RoutingPolicy::DeepSeekV3 && c.n_group > 1) {
    require(e % c.n_group == 0 && e / c.n_group >= 2,
            "route: n_group " + str(c.n_group) + " must divide num_experts " + str(e) +
                " into groups of at least 2");
    require(c.topk_group >= 1 && c.topk_group <= c.n_group,
            "route: topk_group is " + str(c.topk_group) + "; allowed: 1..n_group");
    require(k <= c.topk_group * (e / c.n_group),
            "route: top_k " + str(k) + " exceeds the experts of the kept groups");
  }
  // A pointer without the flag (or the reverse) is a caller bug, not a zero bias.
  const bool wants_bias = is_deepseek(c.policy) && c.has_bias;
  require(wants_bias == (bias != nullptr),
          wants_bias ? "route: has_bias is set but bias is null"
                     : "route: bias is given but the config has none (has_bias with "
                       "DeepSeekV3 or MiniMax2)");
}

// A NaN counts as -inf everywhere: as a key, in a score and in a weight.
float nan_to_neg_inf(float v) { return std::isnan(v) ? kNegInf : v; }

// Moves the k best candidates to the front, best first: the larger key wins,
// equal keys go to the lower expert index. Keys hold no NaN, so this is a
// strict total order and the result does not depend on the input order.
void select_top(const float* keys, std::vector<int>& candidates, int k) {
  std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(),
                    [keys](int a, int b) {
                      return keys[a] > keys[b] || (keys[a] == keys[b] && a < b);
                    });
}

// The two forms keep full relative precision on both sides of 0; sigmoid(-inf)
// is 0 and sigmoid(+inf) is 1, never NaN.
double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

// out[i] = softmax(x)[i] over n values without NaN. When the maximum is
// infinite (+inf, or -inf because every value is -inf) the values equal to it
// share the mass equally and the others get 0: the limit of the finite case.
void softmax(const float* x, int n, double* out) {
  const double m = *std::max_element(x, x + n);
  if (std::isinf(m)) {
    const int ties = static_cast<int>(std::count(x, x + n, static_cast<float>(m)));
    for (int i = 0; i < n; ++i) out[i] = x[i] == m ? 1.0 / ties : 0.0;
    return;
  }
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += out[i] = std::exp(x[i] - m);
  for (int i = 0; i < n; ++i) out[i] /= sum;
}

// w / sum(w); an all-zero w stays all zero (never 0/0).
void renormalize(double* w, int k) {
  const double sum = std::accumulate(w, w + k, 0.0);
  if (sum == 0) return;
  for (int i = 0; i < k; ++i) w[i] /= sum;
}

// Per-token buffers, sized once.
struct Scratch {
  std::vector<float> keys;      // [E] selection key
  std::vector<double> probs;    // [E] softmax over all experts
  std::vector<float> picked;    // [K] keys of the chosen experts
  std::vector<double> weights;  // [K]
  std::vector<int> candidates;  // experts still in the running
  std::vector<float> group_scores;  // [n_group]
  std::vector<int> groups;          // [n_group]
};

// Every policy whose score is increasing in x: keys are the logits.
void route_by_logit(const RoutingConfig& c, const float* x, Scratch& s, int32_t* ids) {
  const int e = c.num_experts, k = c.top_k;
  for (int i = 0; i < e; ++i) s.keys[i] = nan_to_neg_inf(x[i]);
  s.candidates.resize(e);
  std::iota(s.candidates.begin(), s.candidates.end(), 0);
  select_top(s.keys.data(), s.candidates, k);
  for (int j = 0; j < k; ++j) {
    ids[j] = s.candidates[j];
    s.picked[j] = s.keys[ids[j]];
  }
  double* w = s.weights.data();
  switch (c.policy) {
    case RoutingPolicy::Default:
    case RoutingPolicy::RenormalizeNaive:
      softmax(s.keys.data(), e, s.probs.data());
      for (int j = 0; j < k; ++j) w[j] = s.probs[ids[j]];
      if (c.policy == RoutingPolicy::RenormalizeNaive) renormalize(w, k);
      break;
    case RoutingPolicy::Renormalize:
      softmax(s.picked.data(), k, w);
      break;
    case RoutingPolicy::TopK:
      for (int j = 0; j < k; ++j) w[j] = s.picked[j];
      break;
    case RoutingPolicy::Sigmoid:
    case RoutingPolicy::SigmoidRenorm:
    case RoutingPolicy::TopKSigmoid:
    case RoutingPolicy::Llama4:
      for (int j = 0; j < k; ++j) w[j] = sigmoid(s.picked[j]);
      if (c.policy == RoutingPolicy::SigmoidRenorm) renormalize(w, k);
      break;
    case RoutingPolicy::DeepSeekV3:
    case RoutingPolicy::MiniMax2:
      throw std::logic_error("route_by_logit: DeepSeek-style policies key on s + bias");
  }
}

// DeepSeekV3 and MiniMax2. The key c = s + bias is formed in fp32 exactly as
// a kernel forms it, so the reference and the kernel see the same ties.
void route_deepseek(const RoutingConfig& c, const float* x, const float* bias, Scratch& s,
                    int32_t* ids) {
  const int e = c.num_experts, k = c.top_k;
  const int n_group = c.policy == RoutingPolicy::DeepSeekV3 ? c.n_group : 1;
  for (int i = 0; i < e; ++i) {
    // The fp32 score by the fixed operation sequence the kernels share
    // (core/sigmoid_fp32.h), so that both see the same ties.
    const float score = sigmoid_fp32(nan_to_neg_inf(x[i]));
    s.keys[i] = nan_to_neg_inf(score + (bias ? bias[i] : 0.0f));
  }
  s.candidates.clear();
  if (n_group == 1) {
    s.candidates.resize(e);
    std::iota(s.candidates.begin(), s.candidates.end(), 0);
  } else {
    const int per_group = e / n_group;
    for (int g = 0; g < n_group; ++g) {
      const float* key = s.keys.data() + g * per_group;
      float first = kNegInf, second = kNegInf;
      for (int i = 0; i < per_group; ++i) {
        if (key[i] > first) {
          second = first;
          first = key[i];
        } else if (key[i] > second) {
          second = key[i];
        }
      }
      s.group_scores[g] = nan_to_neg_inf(first + second);  // +inf + -inf is NaN
      s.groups[g] = g;
    }
    select_top(s.group_scores.data(), s.groups, c.topk_group);
    for (int j = 0; j < c.topk_group; ++j)
      for (int i = 0; i < per_group; ++i) s.candidates.push_back(s.groups[j] * per_group + i);
  }
  select_top(s.keys.data(), s.candidates, k);
  double sum = 0;
  for (int j = 0; j < k; ++j) {
    ids[j] = s.candidates[j];
    sum += s.weights[j] = sigmoid(nan_to_neg_inf(x[ids[j]]));
  }
  for (int j = 0; j < k; ++j)
    s.weights[j] = s.weights[j] / (sum + kDeepSeekEpsilon) * c.routed_scaling_factor;
}

}  // namespace

Routing route(const RoutingConfig& config, const float* logits, int num_tokens,
              const float* bias) {
  check_arguments(config, logits, num_tokens, bias);
  const int e = config.num_experts, k = config.top_k;
  Routing r;
  r.num_tokens = num_tokens;
  r.top_k = k;
  r.ids.resize(static_cast<std::size_t>(num_tokens) * k);
  r.weights.resize(r.ids.size());

  Scratch s;
  s.keys.resize(e);
  s.probs.resize(e);
  s.picked.resize(k);
  s.weights.resize(k);
  s.candidates.reserve(e);
  s.group_scores.resize(std::max(config.n_group, 1));
  s.groups.resize(std::max(config.n_group, 1));
  for (int t = 0; t < num_tokens; ++t) {
    const float* x = logits + static_cast<std::size_t>(t) * e;
    int32_t* ids = r.ids.data() + static_cast<std::size_t>(t) * k;
    if (is_deepseek(config.policy)) {
      route_deepseek(config, x, bias, s, ids);
    } else {
      route_by_logit(config, x, s, ids);
    }
    float* w = r.weights.data() + static_cast<std::size_t>(t) * k;
    for (int j = 0; j < k; ++j) w[j] = static_cast<float>(s.weights[j]);
  }
  return r;
}

}  // namespace unimoe::ref
