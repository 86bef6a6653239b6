// The reference MoE forward, staged like the device pipeline so that each
// stage's rounding happens at the same place: permute, GEMM1 + activation,
// round the activation tensor, GEMM2, weighted sum over k. Every dot product
// and the final sum are fp64.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "ref/ref.h"

namespace unimoe::ref {
namespace {

// Work items: rows of one expert x a block of output columns. The row block
// lets one weight row, loaded once, serve several tokens from cache; the
// column block gives enough items to balance threads when T is small.
constexpr int kRowBlock = 8;
constexpr int kColBlock = 64;
// Independent partial sums in dot(): the compiler turns them into vector
// lanes without reassociating anything, so the order is fixed by the code.
constexpr int kLanes = 8;

struct Block {
  int expert;              // local expert index
  int row_begin, row_end;  // permuted rows
  int col_begin, col_end;  // output columns
};

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("moe_forward: " + message);
}

// Runs fn(i) for i in [0, count) on up to `threads` threads. Every item
// writes its own outputs and depends on nothing but its index, so the result
// is bit-identical for any thread count. The first exception is rethrown.
template <typename Fn>
void parallel_for(int count, int threads, const Fn& fn) {
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (int i = next++; i < count && !failed; i = next++) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min(threads, count); ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// n is a multiple of kLanes (validate() makes H and I multiples of 8).
double dot(const float* a, const float* b, int n) {
  double lane[kLanes] = {};
  for (int i = 0; i < n; i += kLanes)
    for (int l = 0; l < kLanes; ++l)
      lane[l] += static_cast<double>(a[i + l]) * static_cast<double>(b[i + l]);
  double sum = 0;
  for (int l = 0; l < kLanes; ++l) sum += lane[l];
  return sum;
}

// The sum of |a_i * b_i|: the magnitude a dot product's rounding scales with.
double abs_dot(const float* a, const float* b, int n) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::fabs(static_cast<double>(a[i]) * b[i]);
  return sum;
}

// Cuts every expert's permuted rows and the `cols` outputs into blocks.
std::vector<Block> make_blocks(const Permutation& perm, int cols) {
  std::vector<Block> blocks;
  for (int e = 0; e < static_cast<int>(perm.expert_counts.size()); ++e)
    for (int r = perm.expert_offsets[e]; r < perm.expert_offsets[e + 1]; r += kRowBlock)
      for (int c = 0; c < cols; c += kColBlock)
        blocks.push_back(Block{e, r, std::min(r + kRowBlock, perm.expert_offsets[e + 1]), c,
                               std::min(c + kColBlock, cols)});
  return blocks;
}

void validate_call(const MoEConfig& config, const float* x, const Routing& routing, int threads) {
  validate(config);
  const int num_tokens = routing.num_tokens, top_k = routing.top_k;
  require(num_tokens >= 0,
          "routing.num_tokens is " + std::to_string(num_tokens) + "; must be >= 0");
  require(top_k == config.routing.top_k, "routing.top_k is " + std::to_string(top_k) +
                                             " but the config's top_k is " +
                                             std::to_string(config.routing.top_k));
  const size_t expanded = static_cast<size_t>(num_tokens) * top_k;
  require(routing.ids.size() == expanded && routing.weights.size() == expanded,
          "routing.ids and routing.weights must hold num_tokens * top_k = " +
              std::to_string(expanded) + " entries");
  require(num_tokens == 0 || x != nullptr, "x is null");
  require(threads >= 0, "threads is " + std::to_string(threads) + "; must be >= 0 (0: all cores)");
}

}  // namespace

std::vector<float> moe_forward(const MoEConfig& config, const WeightSource& weights, const float* x,
                               const Routing& routing, int threads,
                               const ActivationScales& scales, double* flip_allowance,
                               double gemm1_sum_precision) {
  validate_call(config, x, routing, threads);
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  const ExpertsConfig& ex = config.experts;
  const int num_tokens = routing.num_tokens, top_k = routing.top_k;
  const int hidden = ex.hidden, inter = ex.intermediate;
  const bool gated = ex.activation != Activation::ReLU2;

  std::vector<float> xq(x, x + static_cast<size_t>(num_tokens) * hidden);
  quantize_activation(ex.quant, xq.data(), num_tokens, hidden, scales.x);

  const Permutation perm = permute(routing.ids.data(), num_tokens, top_k, ex.local_expert_offset,
                                   config.local_experts());
  const int rows = perm.expert_offsets.back();

  // Fetch each hit expert once, in parallel: a source may build the weights.
  std::vector<int> hit;
  for (int e = 0; e < config.local_experts(); ++e)
    if (perm.expert_counts[e] > 0) hit.push_back(e);
  std::vector<ExpertView> views(config.local_experts());
  parallel_for(static_cast<int>(hit.size()), threads, [&](int i) {
    const int e = hit[i];
    views[e] = weights(e);
    // The config decides whether there are biases, not the source.
    if (!ex.has_bias) views[e].b13 = views[e].b2 = nullptr;
    const std::string which = " for local expert " + std::to_string(e);
    require(views[e].w13 != nullptr && views[e].w2 != nullptr,
            "weight source gave null w13 or w2" + which);
    require(!ex.has_bias || (views[e].b13 != nullptr && views[e].b2 != nullptr),
            "the config has biases but the weight source gave null b13 or b2" + which);
  });

  // GEMM1 + activation: a [rows, I], row r is expanded row permuted_to_expanded[r].
  std::vector<float> act(static_cast<size_t>(rows) * inter);
  // Where a device path's GEMM1 sums are coarser than fp32: how far the
  // activation may move when each sum is off by gemm1_sum_precision times
  // the sum of its terms' magnitudes (the largest change of the four
  // corners g +- dg, u +- du).
  const bool slack_wanted = flip_allowance != nullptr && gemm1_sum_precision > 0.0;
  std::vector<float> slack(slack_wanted ? act.size() : 0);
  const std::vector<Block> blocks1 = make_blocks(perm, inter);
  parallel_for(static_cast<int>(blocks1.size()), threads, [&](int i) {
    const Block& b = blocks1[i];
    const ExpertView& v = views[b.expert];
    for (int j = b.col_begin; j < b.col_end; ++j) {
      const float* w_gate = v.w13 + static_cast<size_t>(j) * hidden;
      const float* w_up = v.w13 + static_cast<size_t>(inter + j) * hidden;
      for (int r = b.row_begin; r < b.row_end; ++r) {
        const float* xr =
            xq.data() + static_cast<size_t>(perm.permuted_to_expanded[r] / top_k) * hidden;
        double g = dot(w_gate, xr, hidden), u = 0;
        if (v.b13 != nullptr) g += v.b13[j];
        if (gated) u = dot(w_up, xr, hidden) + (v.b13 != nullptr ? v.b13[inter + j] : 0.0);
        const double a = activate(ex.activation, g, u, ex.swiglu_alpha, ex.swiglu_limit);
        act[static_cast<size_t>(r) * inter + j] = static_cast<float>(a);
        if (slack_wanted) {
          const double dg = gemm1_sum_precision * abs_dot(w_gate, xr, hidden);
          const double du = gated ? gemm1_sum_precision * abs_dot(w_up, xr, hidden) : 0.0;
          double most = 0.0;
          for (double sg : {-1.0, 1.0})
            for (double su : {-1.0, 1.0})
              most = std::max(most, std::fabs(activate(ex.activation, g + sg * dg, u + su * du,
                                                       ex.swiglu_alpha, ex.swiglu_limit) -
                                               a));
          slack[static_cast<size_t>(r) * inter + j] = static_cast<float>(most);
        }
      }
    }
  });

  // One call over the whole [rows, I] tensor, after every row exists: for
  // FP8PerTensor the device's dynamic scale is amax / 448 over all rows of
  // the call, so rounding row by row would be wrong. The other variants round
  // each element or each (row, 128 columns) block, so for them one call over
  // the tensor equals one call per row.
  const std::vector<float> ties =
      flip_allowance != nullptr
          ? fp8_near_ties(ex.quant, act.data(), rows, inter, scales.act, kFlipMargin)
          : std::vector<float>();
  // The elements only the coarser sums bring near a boundary.
  const std::vector<float> slack_ties =
      slack_wanted ? fp8_near_ties(ex.quant, act.data(), rows, inter, scales.act, kFlipMargin,
                                   slack.data())
                   : std::vector<float>();
  quantize_activation(ex.quant, act.data(), rows, inter, scales.act);
  if (flip_allowance != nullptr) {
    // Per token, the flips' changes add up to at most the sum of their
    // norms; the elements only the coarser sums bring near (slack_ties),
    // many where H is large, add in quadrature instead (each moves the
    // output along its own column of w2); tokens' output rows are
    // disjoint, so their sums add in quadrature. A term that is not finite
    // (a non-finite routing weight or weight column) belongs to an output
    // row a check skips.
    std::vector<double> per_token(num_tokens, 0.0), per_token_sq(num_tokens, 0.0);
    for (int e = 0; e < config.local_experts(); ++e) {
      std::vector<double> column_norm;  // w2's column norms, where a tie needs them
      for (int r = perm.expert_offsets[e]; r < perm.expert_offsets[e + 1]; ++r) {
        const int expanded = perm.permuted_to_expanded[r];
        const double w = routing.weights[expanded];
        for (int i = 0; i < inter; ++i) {
          const std::size_t j = static_cast<size_t>(r) * inter + i;
          const bool tie = !std::isnan(ties[j]);
          const bool slack_tie = !tie && slack_wanted && !std::isnan(slack_ties[j]);
          if (!tie && !slack_tie) continue;
          if (column_norm.empty()) {
            column_norm.assign(inter, 0.0);
            for (int h = 0; h < hidden; ++h)
              for (int c = 0; c < inter; ++c) {
                const double v = views[e].w2[static_cast<size_t>(h) * inter + c];
                column_norm[c] += v * v;
              }
            for (double& n : column_norm) n = std::sqrt(n);
          }
          const double other = tie ? ties[j] : slack_ties[j];
          const double term = std::fabs(w * (other - act[j])) * column_norm[i];
          if (!std::isfinite(term)) continue;
          if (tie)
            per_token[expanded / top_k] += term;
          else
            per_token_sq[expanded / top_k] += term * term;
        }
      }
    }
    double sum = 0.0;
    for (int t = 0; t < num_tokens; ++t) {
      const double token = per_token[t] + std::sqrt(per_token_sq[t]);
      sum += token * token;
    }
    *flip_allowance = std::sqrt(sum);
  }

  // GEMM2: y [rows, H], kept in fp64 for the weighted sum.
  std::vector<double> y(static_cast<size_t>(rows) * hidden);
  const std::vector<Block> blocks2 = make_blocks(perm, hidden);
  parallel_for(static_cast<int>(blocks2.size()), threads, [&](int i) {
    const Block& b = blocks2[i];
    const ExpertView& v = views[b.expert];
    for (int h = b.col_begin; h < b.col_end; ++h) {
      const float* w = v.w2 + static_cast<size_t>(h) * inter;
      const double bias = v.b2 != nullptr ? v.b2[h] : 0.0;
      for (int r = b.row_begin; r < b.row_end; ++r)
        y[static_cast<size_t>(r) * hidden + h] =
            dot(w, act.data() + static_cast<size_t>(r) * inter, inter) + bias;
    }
  });

  // Finalize: out[t] = sum over k, in k order, of weight * y; off-rank rows skip.
  std::vector<float> out(static_cast<size_t>(num_tokens) * hidden);
  std::vector<double> acc(hidden);
  for (int t = 0; t < num_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int k = 0; k < top_k; ++k) {
      const int32_t r = perm.expanded_to_permuted[static_cast<size_t>(t) * top_k + k];
      if (r < 0) continue;
      const double w = routing.weights[static_cast<size_t>(t) * top_k + k];
      const double* yr = y.data() + static_cast<size_t>(r) * hidden;
      for (int h = 0; h < hidden; ++h) acc[h] += w * yr[h];
    }
    std::copy(acc.begin(), acc.end(), out.begin() + static_cast<size_t>(t) * hidden);
  }
  return out;
}

double relative_flip_allowance(double flip_allowance, const std::vector<float>& want) {
  double norm = 0.0;
  for (float v : want)
    if (std::isfinite(v)) norm += static_cast<double>(v) * v;
  return norm > 0.0 ? flip_allowance / std::sqrt(norm) : 0.0;
}

}  // namespace unimoe::ref
