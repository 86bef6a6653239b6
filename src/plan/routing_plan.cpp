#include "plan/routing_plan.h"

#include <algorithm>
#include <string>

#include "core/routing_launch_shape.h"
#include "core/routing_limits.h"

namespace unimoe {
namespace {

namespace rs = routing_shape;

constexpr int kWarp = 32;
// The split chain's routing kernel: four warps a block, a warp a token.
constexpr int kSplitTokensPerBlock = 4;

bool deepseek_policy(RoutingPolicy p) {
  return p == RoutingPolicy::DeepSeekV3 || p == RoutingPolicy::MiniMax2;
}

// The routing config as the kernels see it: DeepSeek's groups only for
// DeepSeekV3 (MiniMax2 is its one-group form).
struct Shape {
  bool deepseek;
  int experts, top_k, n_group, topk_group, experts_per_group, slots;
};

Shape shape_of(const RoutingConfig& c) {
  Shape s;
  s.deepseek = deepseek_policy(c.policy);
  s.experts = c.num_experts;
  s.top_k = c.top_k;
  s.n_group = c.policy == RoutingPolicy::DeepSeekV3 ? c.n_group : 1;
  s.topk_group = s.n_group > 1 ? c.topk_group : 1;
  s.experts_per_group = c.num_experts / s.n_group;
  s.slots = rs::slots_for_experts(c.num_experts);
  return s;
}

// The fused kinds: which kernel, built how, launched how. Mirrors the
// kernels' instantiations (kernels/routing/fused_routing.cu): the threshold
// kernels where threshold_serves (the ranked threshold at 4 slots for the
// policies without groups, except where the sorted pair runs), the wide and
// direct-keys kernels where they exist and serve.
void plan_fused(RoutingPlan& plan, const Shape& s, int num_tokens, int num_local, bool cluster,
                const RoutingDeviceCaps& caps, const DevOverrides& dev) {
  const int rows = num_tokens * s.top_k;
  plan.fixed_choice = dev.fixed_choice && s.deepseek &&
                      rs::fixed_choice_serves(s.experts, s.n_group, s.topk_group, s.top_k) &&
                      rs::threshold_serves(s.top_k, s.slots, true, s.topk_group, s.experts_per_group);
  int parts = 0;
  if (dev.wide_choice != WideChoice::kOff && s.deepseek &&
      !(dev.wide_choice == WideChoice::kMeasured && plan.fixed_choice)) {
    parts = rs::wide_parts(s.experts, s.n_group, s.experts_per_group);
    if (dev.wide_choice != WideChoice::kEverywhere && !rs::wide_by_default(parts, s.top_k))
      parts = 0;
  }
  plan.wide_parts = parts;
  plan.wide_floor_rank = rs::wide_floor_rank(s.top_k, parts, s.n_group, s.topk_group);

  if (s.slots >= rs::kThresholdMinSlots || (s.slots == rs::kRankedSlots && !s.deepseek)) {
    // The ranked threshold's kernels do not hold the sorted pair: 33..64
    // rows, where it runs, keep the rounds' kernels.
    const bool pair_runs = plan.sorted_pair && rows > kWarp && rows <= 2 * kWarp;
    const bool ranked_off = s.slots == rs::kRankedSlots && (pair_runs || !dev.ranked_threshold);
    plan.threshold_kernel = !ranked_off && rs::threshold_serves(s.top_k, s.slots, s.deepseek,
                                                                s.topk_group, s.experts_per_group);
  }
  // The wide kernels exist for the DeepSeek policies at 2..16 slots, the
  // direct-keys kernels at 8.
  const bool has_wide = s.deepseek && s.slots >= 2 && s.slots <= 16;
  const bool has_direct = s.deepseek && s.slots == 8;

  int cluster_ctas = rs::kClusterMaxCtas;
  if (cluster) {
    cluster_ctas = dev.cluster_max_ctas > 0 ? dev.cluster_max_ctas
                                            : rs::cluster_max_ctas_by_default(s.deepseek, s.experts);
    if (cluster_ctas > rs::kClusterMaxCtas && !caps.cluster_runs_16[plan.threshold_kernel])
      cluster_ctas = rs::kClusterMaxCtas;
  }
  if (cluster && dev.cluster_spread) {
    const int device_max =
        caps.spread_runs_16[plan.threshold_kernel] ? rs::kSpreadMaxCtas : rs::kClusterMaxCtas;
    const int max_ctas =
        dev.spread_max_ctas > 0 ? std::min(dev.spread_max_ctas, device_max) : device_max;
    const int min_tokens = dev.spread_min_tokens > 0 ? dev.spread_min_tokens
                                                     : rs::default_spread_min_tokens(s.deepseek);
    const rs::SpreadShape shape = rs::spread_shape(s.slots, num_tokens, num_local, s.experts,
                                                   s.deepseek, min_tokens, max_ctas);
    const bool take = dev.spread_from_tokens > 0
                          ? shape.ctas > 0 && num_tokens >= dev.spread_from_tokens
                          : rs::spread_by_default(shape, num_tokens, s.top_k, num_local,
                                                  s.experts, s.deepseek, cluster_ctas);
    if (take) {
      plan.kernel = RoutingKernel::Spread;
      plan.ctas = shape.ctas;
      plan.threads = shape.threads;
      plan.permute_threads = shape.permute_threads;
      plan.tokens_per_cta = shape.tokens_per_cta;
      plan.wide_kernel = has_wide && parts > 0 &&
                         rs::wide_fits(shape.tokens_per_cta, parts, shape.threads / kWarp,
                                       rs::kWideMaxTokensCluster);
      return;
    }
  }
  const int min_tokens =
      !cluster ? 1
      : dev.cluster_min_tokens > 0
          ? dev.cluster_min_tokens
          : rs::cluster_min_tokens_by_default(s.deepseek, s.experts, has_wide && parts > 0);
  const rs::LaunchShape shape = rs::launch_shape(s.slots, num_tokens, num_local, s.experts,
                                                 s.deepseek, cluster, min_tokens, cluster_ctas);
  plan.threads = shape.threads;
  plan.permute_threads = shape.threads;
  if (shape.routing_ctas == 1 &&
      !(cluster && rs::cluster_of_two_for_one_cta(s.deepseek, s.experts))) {
    const int warps = shape.threads / kWarp;
    plan.kernel = RoutingKernel::Block;
    plan.ctas = 1;
    plan.wide_kernel = has_wide && parts > 0 && rows <= kWarp && num_tokens < warps &&
                       num_tokens * s.experts <= rs::kWorkWords &&
                       rs::wide_fits(num_tokens, parts, warps, rs::kWideMaxTokensBlock);
    return;
  }
  plan.kernel = RoutingKernel::Cluster;
  plan.ctas = shape.routing_ctas + 1;
  plan.tokens_per_routing_cta = rs::tokens_per_routing_cta(num_tokens, plan.ctas);
  plan.tokens_per_cta = rs::tokens_per_cta(num_tokens, plan.ctas);
  plan.wide_kernel = has_wide && parts > 0 && shape.overlapped &&
                     rs::wide_fits(plan.tokens_per_routing_cta, parts, shape.threads / kWarp,
                                   rs::kWideMaxTokensCluster);
  // The routing CTAs would stage more keys than they have threads.
  const bool batched_keys =
      shape.overlapped && plan.tokens_per_routing_cta * s.experts > shape.threads;
  plan.direct_keys_kernel = has_direct && !plan.wide_kernel && batched_keys && dev.direct_keys;
}

// The split chain: the routing kernel, then the permute chain.
void plan_split(RoutingPlan& plan, const Shape& s, const RoutingConfig& c, int num_tokens,
                int num_local, bool precomputed, const RoutingDeviceCaps& caps,
                const DevOverrides& dev) {
  const int rows = num_tokens * s.top_k;
  if (!precomputed && num_tokens > 0) {
    if (rs::split_takes_octets(s.deepseek, s.experts, s.top_k, s.n_group, num_tokens,
                               dev.split_octets_min_tokens)) {
      plan.kernel = RoutingKernel::SplitOctets;
      plan.octet_filter =
          rs::octets_filter(s.experts, s.n_group, num_tokens, dev.split_octet_filter_min_tokens);
      // The octet kernel counts the permute's rows where the chain has a
      // count kernel (more than kCountScanRows rows) and a permute chunk is
      // whole octet blocks.
      plan.routing_counts_rows =
          dev.split_octet_count && rows > permute_chunks::kCountScanRows &&
          rs::octet_count_blocks(s.top_k, permute_chunks::chunk_rows_for(rows)) > 0;
    } else {
      plan.kernel = RoutingKernel::SplitWarps;
      plan.split_blocks = (num_tokens + kSplitTokensPerBlock - 1) / kSplitTokensPerBlock;
      plan.split_batched = rs::split_weighs_in_batches(num_tokens, split_weight(c.policy),
                                                       dev.split_batch_min_tokens);
      plan.split_sorted_runs =
          s.slots <= rs::kSortMaxSlots &&
          rs::split_sorts_runs(s.slots, s.top_k, num_tokens, s.deepseek, dev.split_sort_from_topk);
      plan.split_kept_halves =
          plan.split_sorted_runs && s.deepseek && s.slots % 2 == 0 && dev.split_kept_halves &&
          routing_limits::compacts_kept_lanes(s.n_group, s.topk_group, s.experts_per_group,
                                              s.slots);
    }
  }
  plan.permute_chunks = std::max(permute_chunks::num_chunks(rows), 1);
  plan.scatter_masks = plan.routing_counts_rows && dev.scatter_masks;
  const int scan_ctas =
      (num_local + permute_chunks::kScanExpertsPerCta - 1) / permute_chunks::kScanExpertsPerCta;
  plan.scan_triggers_scatter =
      dev.permute_trigger &&
      (plan.scatter_masks || plan.permute_chunks + scan_ctas <= caps.sm_count);
}

}  // namespace

rs::SplitWeight split_weight(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::TopK: return rs::SplitWeight::kLogit;
    case RoutingPolicy::Default:
    case RoutingPolicy::RenormalizeNaive: return rs::SplitWeight::kRowSoftmax;
    case RoutingPolicy::DeepSeekV3:
    case RoutingPolicy::MiniMax2: return rs::SplitWeight::kDeepSeek;
    case RoutingPolicy::Renormalize:
    case RoutingPolicy::Sigmoid:
    case RoutingPolicy::SigmoidRenorm:
    case RoutingPolicy::TopKSigmoid:
    case RoutingPolicy::Llama4: break;
  }
  return rs::SplitWeight::kChosen;
}

RoutingPlan plan_routing(const MoEConfig& config, int num_tokens, bool precomputed,
                         const RoutingDeviceCaps& caps, const DevOverrides& dev) {
  const RoutingConfig& c = config.routing;
  const int num_local = config.local_experts();
  const Shape s = shape_of(c);
  RoutingPlan plan;
  plan.pdl = dev.pdl;
  plan.sorted_pair = dev.sorted_pair;
  plan.slots = s.slots;
  const std::string& forced = config.options.routing_variant;
  plan.variant = forced == "auto" ? routing_variant_for(c, num_tokens)
                                  : parse_routing_variant(forced);
  if (!routing_limits::fused_routing_fits(num_tokens, c.top_k, num_local))
    plan.variant = RoutingVariant::Split;

  if (plan.variant == RoutingVariant::Split) {
    plan_split(plan, s, c, num_tokens, num_local, precomputed, caps, dev);
    return plan;
  }
  if (precomputed || num_tokens == 0) {
    plan.kernel = RoutingKernel::PermuteOnly;
    plan.threads = rs::kMaxThreads;
    plan.permute_threads = rs::kMaxThreads;
    return plan;
  }
  plan_fused(plan, s, num_tokens, num_local, plan.variant == RoutingVariant::Cluster, caps, dev);
  plan.selection = plan.wide_kernel ? RoutingSelection::Wide
                   : !plan.threshold_kernel ? RoutingSelection::Rounds
                   : plan.fixed_choice      ? RoutingSelection::FixedChoice
                   : s.slots == rs::kRankedSlots ? RoutingSelection::RankedThreshold
                                                 : RoutingSelection::Threshold;
  return plan;
}

}  // namespace unimoe
