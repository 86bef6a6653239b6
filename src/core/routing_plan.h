// How routing and sort/permute launch for one call size, as plain data:
// the variant, the kernel, how it is built and launched. plan_routing
// (plan/routing_plan.h) fills it; the launchers
// (kernels/routing/routing_launch.cuh) take it and decide nothing;
// MoELayer::describe prints it.
#pragma once

#include <string>

#include "unimoe/unimoe.h"

namespace unimoe {

// The three ways routing and permute run (docs/routing.md, "Variants"):
//   Split: a routing kernel (a warp a token, or the octet kernel), then the
//          permute chain (count, scan, scatter: two or three launches);
//   Fused: one block routes every token and permutes (T * K <= 4096,
//          E_local <= 1024);
//   Cluster: a thread-block cluster whose first CTA permutes while the
//          others route (same limits); it launches the single block, or the
//          spread kernel, where those are measured faster.
enum class RoutingVariant { Split, Fused, Cluster };
const char* routing_variant_name(RoutingVariant v);
// "split", "fused" or "cluster"; throws Error (field `field`) naming the
// allowed values.
RoutingVariant parse_routing_variant(const std::string& s,
                                     const char* field = "options.routing_variant");

// What the device can do that the launch depends on, probed once per layer
// (probe_routing_device_caps, kernels/routing/routing_launch.cuh).
struct RoutingDeviceCaps {
  int sm_count = 0;
  // The config's CTA-0 cluster kernels (and their twins) run in clusters
  // of 16 CTAs (non-portable); else the portable 8 is their largest.
  // Indexed by the selection they are built with: [0] the rounds, [1] the
  // threshold kernels.
  bool cluster_runs_16[2] = {false, false};
  // Likewise the spread kernels.
  bool spread_runs_16[2] = {false, false};
};

// The kernel that routes (and, for the fused kinds, permutes).
enum class RoutingKernel {
  None,         // nothing to route: T = 0 or precomputed ids on the split chain
  PermuteOnly,  // one block permutes given ids (or writes the empty outputs)
  Block,        // one block routes every token and permutes
  Cluster,      // CTA 0 permutes while CTAs 1.. route (or all route, then CTA 0 permutes)
  Spread,       // every CTA of a cluster routes its tokens and places its own rows
  SplitWarps,   // the split chain's routing kernel, a warp a token
  SplitOctets,  // the split chain's DeepSeek kernel, eight lanes a token
};
const char* routing_kernel_name(RoutingKernel k);

// How a fused-kind kernel chooses each token's K experts.
enum class RoutingSelection {
  Rounds,           // K rounds of a warp arg-max
  Threshold,        // a threshold from the lanes' bests, then ranks (E > 128, K >= 8)
  RankedThreshold,  // the threshold, then at most 32 candidates ranked (E = 65..128)
  FixedChoice,      // DeepSeek-V3's shape compiled in (E=256, 8 groups, 4 kept, K=8)
  Wide,             // a token chosen by E / 32 warps (DeepSeek policies)
};
const char* routing_selection_name(RoutingSelection s);

struct RoutingPlan {
  RoutingVariant variant = RoutingVariant::Split;
  RoutingKernel kernel = RoutingKernel::None;
  bool pdl = true;  // programmatic dependent launch on every kernel of the chain

  // ---- fused kinds (PermuteOnly, Block, Cluster, Spread)
  int slots = 0;             // experts per lane the kernel is built for (1..32)
  bool threshold_kernel = false;  // the kernel built with the threshold selection
  bool wide_kernel = false;       // the wide choice's kernel
  bool direct_keys_kernel = false;  // DeepSeek keys a warp a token (E = 129..256)
  RoutingSelection selection = RoutingSelection::Rounds;
  bool fixed_choice = false;  // kernel parameter: the threshold kernels take the fixed choice
  int wide_parts = 0;         // kernel parameter: warps a token of the wide choice (0: off)
  int wide_floor_rank = 0;    // kernel parameter
  bool sorted_pair = true;    // kernel parameter: 33..64 rows by one warp's sort
  int ctas = 1;               // the grid: one cluster of `ctas` CTAs (1: a plain block)
  int threads = 0;            // threads a CTA
  int permute_threads = 0;    // threads that permute (the spread kernel: fewer than `threads`)
  int tokens_per_cta = 0;           // Cluster, Spread
  int tokens_per_routing_cta = 0;   // Cluster

  // ---- split chain (SplitWarps, SplitOctets, and the permute chain)
  int split_blocks = 0;        // SplitWarps grid
  bool split_batched = false;  // SplitWarps weighs a block's four tokens together
  bool split_sorted_runs = false;  // SplitWarps sorts each lane's experts once
  bool split_kept_halves = false;  // ... and compacts DeepSeek's kept groups
  bool octet_filter = false;   // SplitOctets filter mode (taken only for 16-byte aligned logits)
  bool routing_counts_rows = false;  // SplitOctets writes the permute's chunk counts: no count kernel
  int permute_chunks = 0;            // scatter CTAs
  bool scan_triggers_scatter = false;  // the scan lets the scatter launch before it ends
  bool scatter_masks = false;          // the scatter ranks rows by token masks before its wait

  // One line, e.g. "routing=cluster kernel=cluster ctas=5 threads=256 select=threshold".
  std::string to_string() const;
};

bool operator==(const RoutingPlan& a, const RoutingPlan& b);
inline bool operator!=(const RoutingPlan& a, const RoutingPlan& b) { return !(a == b); }

}  // namespace unimoe
