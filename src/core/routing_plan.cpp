#include "core/routing_plan.h"

#include <sstream>
#include <string>

namespace unimoe {

const char* routing_variant_name(RoutingVariant v) {
  switch (v) {
    case RoutingVariant::Split: return "split";
    case RoutingVariant::Fused: return "fused";
    case RoutingVariant::Cluster: return "cluster";
  }
  return "?";
}

RoutingVariant parse_routing_variant(const std::string& s, const char* field) {
  for (RoutingVariant v : {RoutingVariant::Split, RoutingVariant::Fused, RoutingVariant::Cluster})
    if (s == routing_variant_name(v)) return v;
  throw Error(field, "is '" + s + "'; allowed: split, fused, cluster");
}

const char* routing_kernel_name(RoutingKernel k) {
  switch (k) {
    case RoutingKernel::None: return "none";
    case RoutingKernel::PermuteOnly: return "permute_only";
    case RoutingKernel::Block: return "block";
    case RoutingKernel::Cluster: return "cluster";
    case RoutingKernel::Spread: return "spread";
    case RoutingKernel::SplitWarps: return "warps";
    case RoutingKernel::SplitOctets: return "octets";
  }
  return "?";
}

const char* routing_selection_name(RoutingSelection s) {
  switch (s) {
    case RoutingSelection::Rounds: return "rounds";
    case RoutingSelection::Threshold: return "threshold";
    case RoutingSelection::RankedThreshold: return "ranked_threshold";
    case RoutingSelection::FixedChoice: return "fixed";
    case RoutingSelection::Wide: return "wide";
  }
  return "?";
}

std::string RoutingPlan::to_string() const {
  std::ostringstream o;
  o << "routing=" << routing_variant_name(variant) << " kernel=" << routing_kernel_name(kernel);
  switch (kernel) {
    case RoutingKernel::None: break;
    case RoutingKernel::PermuteOnly: o << " threads=" << threads; break;
    case RoutingKernel::Block:
    case RoutingKernel::Cluster:
    case RoutingKernel::Spread:
      o << " ctas=" << ctas << " threads=" << threads;
      if (permute_threads != threads) o << " permute_threads=" << permute_threads;
      if (kernel != RoutingKernel::Block) o << " tokens_per_cta=" << tokens_per_cta;
      o << " slots=" << slots << " select=" << routing_selection_name(selection);
      if (direct_keys_kernel) o << " direct_keys";
      if (wide_parts > 0) o << " wide_parts=" << wide_parts;
      if (!sorted_pair) o << " sorted_pair=0";
      break;
    case RoutingKernel::SplitWarps:
      o << " blocks=" << split_blocks << (split_batched ? " batched" : "")
        << (split_sorted_runs ? " sorted_runs" : "") << (split_kept_halves ? " kept_halves" : "");
      break;
    case RoutingKernel::SplitOctets:
      o << (octet_filter ? " filter" : "") << (routing_counts_rows ? " counts_rows" : "");
      break;
  }
  if (variant == RoutingVariant::Split)
    o << " permute_chunks=" << permute_chunks << (scan_triggers_scatter ? " scan_trigger" : "")
      << (scatter_masks ? " scatter_masks" : "");
  if (!pdl) o << " pdl=0";
  return o.str();
}

bool operator==(const RoutingPlan& a, const RoutingPlan& b) {
  return a.to_string() == b.to_string() && a.fixed_choice == b.fixed_choice &&
         a.wide_floor_rank == b.wide_floor_rank && a.threshold_kernel == b.threshold_kernel &&
         a.wide_kernel == b.wide_kernel && a.tokens_per_routing_cta == b.tokens_per_routing_cta;
}

}  // namespace unimoe
