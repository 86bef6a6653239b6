// Routing and sort/permute fused into one launch of one thread block (or one
// thread-block cluster, below), for
// small inputs where the fixed cost of launch_routing + launch_permute (four
// launches) dominates. Writes exactly what those two write (contracts:
// routing.cuh, permute.cuh): topk_ids, topk_weights, expert counts and
// offsets, both row maps, every requested tile schedule and its tile count.
// Graph-safe: no host sync, no scratch; T = 0 still writes counts, offsets
// and tile counts (all 0).
//
// Two modes, chosen by routing.logits:
//   - routing (logits set): routes routing.num_tokens tokens into
//     routing.topk_ids / topk_weights and permutes them; permute.topk_ids is
//     not read and must be null or routing.topk_ids.
//   - precomputed (logits null): permutes the ids in permute.topk_ids as
//     given; of `routing` nothing is read, and nothing is written to its
//     outputs.
// T, K and the rank's expert range come from `permute`; in routing mode they
// must agree with routing.num_tokens and routing.config.top_k.
#pragma once

#include <cuda_runtime.h>

#include "core/routing_launch_shape.h"
#include "kernels/permute/permute.cuh"
#include "kernels/routing/routing.cuh"

namespace unimoe {

// The largest inputs one block serves: T * K expanded rows and E_local.
inline constexpr int kFusedMaxRows = 4096;
inline constexpr int kFusedMaxLocalExperts = 1024;

// Whether launch_fused_routing_permute takes (T, K, E_local).
bool fused_routing_fits(int num_tokens, int top_k, int num_local);

// Throws std::invalid_argument for inputs that do not fit or do not agree.
void launch_fused_routing_permute(const RoutingParams& routing, const PermuteParams& permute,
                                  cudaStream_t stream);

// The cluster variant: the same outputs and limits, with the per-token
// routing spread over CTAs 1.. of a thread-block cluster (a warp per
// token, a few tokens a CTA: routing_shape::cluster_min_tokens_by_default,
// DeepSeek 1 with the wide choice else 2, the others 2 below E = 256 else
// 4; UNIMOE_CLUSTER_MIN_TOKENS overrides it), while its first CTA permutes
// every row, reading the rows'
// experts that the others wrote into its shared memory (the others weigh
// their experts meanwhile). Where one routing CTA is enough it launches,
// for the DeepSeek policies and above E = 128, the fused block itself, and
// for the others a cluster of 2 (routing_shape::cluster_of_two_for_one_cta: inside a model,
// with other kernels between two calls, the single block's call ran about
// 1 us longer than back to back and the cluster's did not; session 25). In
// precomputed mode it launches the fused block.
// Its largest cluster: 16 CTAs (non-portable) for the DeepSeek policies at
// E >= 128 and the others at E >= 256, else 8
// (routing_shape::cluster_max_ctas_by_default, measured); 8 where the
// device may not run the kernel in clusters of 16. set_cluster_max_ctas
// (UNIMOE_CLUSTER_MAX_CTAS at start) replaces the rule, for tests and A/B
// timing.
//
// Where routing_shape::spread_by_default says so (routing mode; for the
// DeepSeek policies at E >= 128 from T = 121 where this kernel runs in
// clusters of 16, else 64; the others from 128; K <= 8; the launch
// shape, routing_shape::spread_shape, serving with a permuting thread per
// local expert), the cluster variant launches the spread kernel instead:
// every CTA of a cluster of up to 16 routes its run of tokens and places
// its own rows, counting each expert's rows across the cluster in
// distributed shared memory, so that no CTA permutes the others' rows.
inline constexpr int kClusterMaxCtas = routing_shape::kClusterMaxCtas;
void launch_cluster_routing_permute(const RoutingParams& routing, const PermuteParams& permute,
                                    cudaStream_t stream);

// The cluster variant's use of the spread kernel, process-wide: `on`
// (UNIMOE_CLUSTER_SPREAD, on unless "0"), its largest cluster, `max_ctas`
// (UNIMOE_SPREAD_MAX_CTAS; 0: the device's largest, 16 where it runs such a
// cluster, else 8), and `from_tokens`: from that many tokens wherever it
// serves, instead of the measured defaults. For tests and A/B timing;
// set_cluster_spread throws std::invalid_argument for max_ctas other than 0
// or 2..16, or a negative from_tokens.
struct ClusterSpread {
  bool on;
  int max_ctas;
  int from_tokens;  // UNIMOE_SPREAD_FROM_TOKENS; 0: routing_shape::spread_by_default
};
ClusterSpread cluster_spread();
void set_cluster_spread(ClusterSpread setting);

// The cluster kernel's largest cluster, process-wide: 0 (the default) for
// the measured rule, else 2..16 for every call (16 where the device runs
// it, else 8). Throws std::invalid_argument for other values.
int cluster_max_ctas();
void set_cluster_max_ctas(int max_ctas);

// Whether 33..64 rows permute by one warp's sort of two keys a lane
// (block_permute.cuh, permute_sorted_pair), process-wide: on by default
// (in every kernel but the threshold kernels of the policies without
// groups, which do not hold it); off, they take the token masks or the
// general path. UNIMOE_SORTED_PAIR=0
// starts the process with it off. For tests and A/B timing.
bool sorted_pair();
void set_sorted_pair(bool on);

// Whether the cluster kernel's routing CTAs compute DeepSeek's keys a warp
// a token (its own lanes' logits and biases, 16-byte loads) where the block
// would stage more keys than it has threads (E = 129..256: more than
// 1024 / E tokens a routing CTA, DeepSeekV3 E=256 from T=61), rather than
// staging them by the block in several batches, process-wide: on by
// default; UNIMOE_DIRECT_KEYS=0 starts the process with it off. For tests
// and A/B timing.
bool direct_keys();
void set_direct_keys(bool on);

// Whether the DeepSeek decode kernels choose DeepSeek-V3/R1's routing
// (E=256, 8 groups, 4 kept, K=8: routing_shape::fixed_choice_serves, in
// the threshold kernels) by the fixed choice, the shape compiled in
// (routing_fixed.cuh; docs/routing.md, "The fixed choice"), process-wide:
// on by default; UNIMOE_FIXED_CHOICE=0 starts the process with it off. The
// wide choice then stands aside for those calls unless set kEverywhere.
// For tests and A/B timing.
bool fixed_choice();
void set_fixed_choice(bool on);

// Whether the decode kernels of the policies without groups at 4 slots a
// lane (E = 65..128) choose by the ranked threshold
// (routing_detail::rounds_by_ranked_threshold, where
// routing_shape::threshold_serves: K = 8..21) rather than by K rounds,
// except at 33..64 rows, where the sorted pair runs in the rounds'
// kernels (docs/routing.md, "The ranked threshold"), process-wide: on by
// default; UNIMOE_RANKED_THRESHOLD=0 starts the process with it off. For
// tests and A/B timing.
bool ranked_threshold();
void set_ranked_threshold(bool on);

// The DeepSeek decode kernels' wide choice (E / 32 warps a token, groups of
// 32 experts; docs/routing.md, "The wide choice"), process-wide:
//   kMeasured (default): where routing_shape::wide_by_default says it wins
//     (E / 32 * K >= 48; DeepSeekV3 E=256 K=8 0.88x at T=1, 0.95-0.99x at
//     T = 2..14, session 20 run 3) and the fixed choice does not run;
//   kEverywhere: wherever it serves (routing_shape::wide_parts), for tests
//     and A/B timing;
//   kOff: never.
// UNIMOE_WIDE_CHOICE=0 / 1 starts the process at kOff / kEverywhere.
enum class WideChoice { kOff, kMeasured, kEverywhere };
WideChoice wide_choice();
void set_wide_choice(WideChoice setting);

}  // namespace unimoe
