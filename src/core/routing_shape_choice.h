// Which choice the decode kernels take: threshold and ranked threshold, the
// fixed DeepSeek-V3 choice, the wide choice; and the cluster defaults that
// depend on them. Host and device (UNIMOE_HD). Part of
// core/routing_launch_shape.h.
#pragma once

#include "core/host_device.h"
#include "core/routing_shape_fused.h"

namespace unimoe::routing_shape {

// The decode kernels' K best by a threshold and ranks
// (routing_detail::rounds_by_threshold) rather than K rounds: only in the
// kernels built with it (the launcher takes them where threshold_serves),
// which hold the rounds too, for calls where it does not serve and for rows
// whose candidates pass 32. At least kThresholdMinSlots slots a lane
// (E > 128), K >= kThresholdMinTopK, and the lanes that hold candidates
// (every lane with strided slots; with runs, DeepSeek's, about those of the
// kept groups: topk_group * E / n_group / slots) at least 1.5 K, so that the
// K-th best of their bests leaves few candidates above it. Measured on an
// H200 (the decode grid of scripts/routing_ab.sh over E 64..1024, K 4..22, T
// 1..256, against the K rounds everywhere; the sweep's DeepSeekV3 keeps 4 of
// 8 groups; geometric means over T, the kernels as they are):
//   - K = 8: 1-2% faster at E = 256, 6-13% at E = 384..1024 (Renormalize
//     E=384 T=64 5.97 -> 4.84 us, DeepSeekV3 E=384 T=128 12.90 -> 10.64);
//   - K = 16 without groups: 16-29% faster;
//   - slower: K = 4 by 7-11% (its fixed steps cost about four rounds),
//     DeepSeekV3 at K = 16 and 22 by 6-11% (16 kept lanes: candidates pass
//     32 and the rounds follow), K = 22 without groups mixed (0.63-1.18x);
//   - a kernel built with it ran 2-6% slower where it took the rounds, hence
//     the kernels apart.
// At kRankedSlots slots a lane (E = 65..128) the policies without groups take
// it too, from K = kRankedMinTopK, in the form that ranks the list by
// rank_candidates (routing_detail::rounds_by_ranked_threshold). Measured on
// an H200 (scripts/routing_ab.sh -r 3, Renormalize, TopK and Default at
// E = 96 and 128, the same binary with it off and on): the cluster variant at
// K = 8 0.92-0.95 at T = 1..4 and 12..32 (Renormalize E=128 T=1 2.47 -> 2.28
// us, T=32 3.01 -> 2.89), 0.98 at T = 48..64; K = 10 and 16 0.79-0.93 at
// every T to 128 where they run (1.00 at 33..64 rows, which keep the rounds);
// K = 6 0.97-0.98 to T = 32 but 1.02-1.04 from T = 48 (the choice probe,
// bench/probes/choice_floor.cu: slower from 8 warps a block), so K = 6 keeps
// the rounds; K = 4 slower in the probe.
inline constexpr int kThresholdMinSlots = 8;
inline constexpr int kThresholdMinTopK = 8;
inline constexpr int kRankedSlots = 4;
inline constexpr int kRankedMinTopK = 8;

UNIMOE_HD bool threshold_serves(int top_k, int slots, bool runs, int topk_group,
                                int experts_per_group) {
  const int kept = runs ? topk_group * experts_per_group / slots : kWarp;
  const int lanes = kept < kWarp ? kept : kWarp;
  const bool wide = slots >= kThresholdMinSlots && top_k >= kThresholdMinTopK;
  const bool ranked = !runs && slots == kRankedSlots && top_k >= kRankedMinTopK;
  return (wide || ranked) && 3 * top_k <= 2 * lanes;
}

// The fixed choice (kernels/routing/routing_fixed.cuh,
// choose_deepseek_fixed): DeepSeek's decode choice with the shape of
// DeepSeek-V3/R1 compiled in, E = 256 in kFixedGroups groups of 32 (4 lanes
// of 8 slots), kFixedKept kept, and K at most twice the kept groups (their
// two best keys a group reach K). It lives in the threshold kernels of 8
// slots a lane, so it runs where threshold_serves too: K = 8. Measured on an
// H200 (bench/probes/choice_floor.cu, one warp choosing from staged keys,
// median cycles): 986 against 2,622 for the group stage and
// rounds_by_threshold at one choosing warp a block, 1,081 against 2,647 at
// four, 1,221 against 2,883 at five.
inline constexpr int kFixedExperts = 256;
inline constexpr int kFixedGroups = 8;
inline constexpr int kFixedKept = 4;
UNIMOE_HD bool fixed_choice_serves(int num_experts, int n_group, int topk_group, int top_k) {
  return num_experts == kFixedExperts && n_group == kFixedGroups && topk_group == kFixedKept &&
         top_k >= 1 && top_k <= 2 * kFixedKept;
}

// The wide choice of the DeepSeek policies' decode kernels
// (kernels/routing/routing_wide.cuh): E / 32 warps (parts) choose a token, a
// thread an expert, where each group is one part of 32 experts (DeepSeekV3
// E=256 n_group=8). 0 where it does not serve. Measured on an H200 (against
// each token's own warp): DeepSeekV3 E=256 K=8 0.85-0.93 at T = 1..12,
// 0.97-0.98 at T = 16..20, but 1.02-1.03 from 4 tokens a routing CTA
// (T = 24..28, and the spread kernel's T = 64): every part runs the same
// steps, so a CTA's 24-32 busy warps are bound by issue, not by a chain
// (stamps: each phase 1.5-2x longer at 3-4 tokens a CTA than at 1); without
// groups (MiniMax2) 1.05-1.16x slower at E <= 128 and mixed above
// (0.87-1.17), so not there.
UNIMOE_HD int wide_parts(int num_experts, int n_group, int experts_per_group) {
  if (num_experts % kWarp != 0 || num_experts < 2 * kWarp || num_experts > kMaxThreads) return 0;
  if (n_group <= 1 || experts_per_group != kWarp) return 0;
  return num_experts / kWarp;
}

// Where the wide choice runs by default (where it serves: wide_parts > 0):
// parts * K >= kWideMinWork, a long enough warp's chain (it grows with the
// experts a lane and with K). Measured on an H200 (DeepSeekV3 in groups of
// 32, topk_group n_group / 2, T = 1..20, against each token's own warp in the
// same build):
//   E=256 (8 parts): K=4 0.95 at T=1 but 1.02-1.03 at T = 3..14; K=6 0.91
//     at T=1, 0.99 at 2..14; K=8 0.88 at T=1, 0.95-0.99 at 2..14; K=10
//     0.89-1.00; K=16 0.80-0.94; K=22 0.74-1.00;
//   E=128 (4 parts): K = 4..8 1.01-1.10, K=16 0.96-0.97;
//   E=64 (2 parts): K = 4..16 1.07-1.12;
//   E=384 and 512 (12 and 16 parts, K = 8..22): 0.69-0.83 at T=1, where
//     alone they seat a token (1.00 beyond).
inline constexpr int kWideMinWork = 48;
UNIMOE_HD bool wide_by_default(int parts, int top_k) {
  return parts >= 2 && parts * top_k >= kWideMinWork;
}

// The cluster variant's minimum tokens a routing CTA by default. A CTA of
// many routing warps gets slower with its size (Renormalize E=128 K=8
// T=16, 512 threads, 4.9 us; T=32, 1024 threads, 6.5; inferred: its SM's
// issue rate), so spreading the tokens over more CTAs pays while the
// cluster's barrier costs less than that:
// - the DeepSeek policies: 1 where the call takes the wide kernels, else
//   2. Measured on an H200 (against 2 in the same build): DeepSeekV3 E=256
//   K=8 0.91-0.93 at T = 2..14 (T=5 4.04 -> 3.67 us), E=512 0.87-0.95 (the
//   wide choice seats one token of 16 parts only); without it (E=128)
//   0.98-1.05;
// - the others: 2 in clusters of 8 (E < 256), else 4. Measured on an H200
//   (Renormalize/Default/TopK/Sigmoid, K = 1..8): E = 8..160 0.90-0.99 at
//   T = 3..4 (Renormalize E=128 K=8 3.07 -> 2.62 us), within 1.5% beyond;
//   E=256 1.06-1.12 at T = 3..4.
UNIMOE_HD int cluster_min_tokens_by_default(bool deepseek, int num_experts, bool wide) {
  if (deepseek) return wide ? 1 : 2;
  return num_experts < kClusterLargeFromExpertsOther ? 2 : 4;
}

// Where one routing CTA serves a call of the cluster variant (its smallest
// calls), whether it still launches a cluster, of 2 CTAs (CTA 0 permutes, CTA
// 1 routes), rather than the single block: the policies without DeepSeek's
// decode path, at E <= 128. Measured on an H200:
// - the same binary with and without it: Renormalize E=128 K=8
//   T=1 back to back (the sweep) 2.29 -> 2.42 us, T=2 within 0.03; but
//   after kernels that evict the SMs' instruction caches
//   (`--evict-icache`), as inside a model, the single block's call ends
//   2,000 cycles later than back to back and the cluster's does not (CTA
//   0 done 6,293 against 4,224 cycles after the wait), and the
//   qwen3-30b-a3b layer at T=1 takes 26.7 us against 27.55. DeepSeekV3
//   E=256 (whose single block takes the wide choice) went 3.02 -> 3.55
//   back to back and its dsv3-tp8 layer 30.45 -> 31.4 at T=1: not there.
// - a full sweep with it for every E: back to back, the cluster
//   variant at T <= 4 without DeepSeek's policies 1.005x at E=128, 1.017
//   at E=8, 1.022 at E=64, but 1.049 at E=256 and 1.077 at E=1024 (T=1
//   3.26 -> 3.95 us), where the cold case was not measured: left out.
inline constexpr int kClusterOfTwoMaxExperts = 128;
UNIMOE_HD bool cluster_of_two_for_one_cta(bool deepseek, int num_experts) {
  return !deepseek && num_experts <= kClusterOfTwoMaxExperts;
}

// The most tokens a block seats: the single block (its decode way, T <= 4 at
// E = 256) 4, a routing CTA of the cluster or spread kernels 2. Measured on
// an H200 (DeepSeekV3 E=256): the single block 0.82-0.92 at K=8 (T=1
// 3.70 -> 3.02 us), 0.92-0.99 at K=4; the cluster at 2 tokens a CTA
// (T = 5..14) 0.93 at K=8 and 1.00 at K=4, but at 3 (T = 15..21) 0.98-1.00 at
// K=8 and 1.04-1.05 at K=4.
inline constexpr int kWideMaxTokensBlock = 4;
inline constexpr int kWideMaxTokensCluster = 2;

// The rank m of each kept part's floor: ceil(K / kept parts), the kept
// parts topk_group with groups (n_group > 1), else all `parts`; m keys of
// each reach the threshold, K in all.
UNIMOE_HD int wide_floor_rank(int top_k, int parts, int n_group, int topk_group) {
  const int kept = n_group > 1 ? topk_group : parts;
  return kept > 0 ? (top_k + kept - 1) / kept : 0;
}

// Whether a block of `warps` warps seats `tokens` tokens (at most
// max_tokens) of `parts` parts (wide_parts, 0: never).
UNIMOE_HD bool wide_fits(int tokens, int parts, int warps, int max_tokens) {
  return parts >= 2 && tokens <= max_tokens && tokens * parts <= warps;
}

}  // namespace unimoe::routing_shape
