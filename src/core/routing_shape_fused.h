// Launch shapes of the fused block, cluster and spread routing kernels:
// threads a block, routing CTAs a cluster, whether the cluster kernel runs
// overlapped, the spread kernel's shape and when it serves by default.
// Host and device (UNIMOE_HD). Part of core/routing_launch_shape.h.
#pragma once

#include "core/host_device.h"

namespace unimoe::routing_shape {

inline constexpr int kWarp = 32;
// The block's work area in 32-bit words (the warps' group keys, DeepSeek's
// staged keys, the permutation's counters and tile bases).
inline constexpr int kWorkWords = 8192;
inline constexpr int kMaxThreads = 1024;
// The portable cluster size: CTA 0 permutes, up to 7 CTAs route. Up to
// kClusterMaxCtasNonPortable where the launcher allows it
// (UNIMOE_CLUSTER_MAX_CTAS).
inline constexpr int kClusterMaxCtas = 8;
inline constexpr int kClusterMaxCtasNonPortable = 16;

// The cluster kernel's largest cluster by default (where the device runs
// clusters of 16): 16 for the DeepSeek policies at E >= 128 and for the
// others at E >= 256, else 8. Measured on an H200 (against 8 in the same
// build, T = 5..128, K = 4 and 8): DeepSeekV3 E=256 K=8 T=32 5.19 -> 4.42 us,
// T=48 5.42 -> 4.75, 0.92-0.99 at T = 16..28, 0.84-0.88 at 32..56; E=128
// 0.86-0.96 at 32..63, E=512 0.71-0.87 at 32..128; the others 0.81-0.98 at
// E=512 from T=32, 0.97-1.01 at E=256, but 1.03-1.13 at E=128 from T=36 (a
// short choice a token: the larger cluster's barrier costs more than the
// fewer tokens a CTA save). T <= 12: 0.99-1.01.
inline constexpr int kClusterLargeFromExpertsDeepSeek = 128;
inline constexpr int kClusterLargeFromExpertsOther = 256;
UNIMOE_HD int cluster_max_ctas_by_default(bool deepseek, int num_experts) {
  const int from = deepseek ? kClusterLargeFromExpertsDeepSeek : kClusterLargeFromExpertsOther;
  return num_experts >= from ? kClusterMaxCtasNonPortable : kClusterMaxCtas;
}

// Threads of the routing kernel for `per_lane` experts a lane: every warp
// gets per_lane * 32 group keys in the work area. This also bounds
// registers: 32 experts a lane need about 150 a thread, which 256 threads
// allow.
constexpr int fused_threads(int per_lane) {
  return kWorkWords / per_lane < kMaxThreads ? kWorkWords / per_lane : kMaxThreads;
}

// Threads for a block: a warp per token, a thread per local expert (the
// scan phases give each thread a run of experts) and, for DeepSeek
// policies, a thread per staged key (`num_keys`); whole warps, at least 4,
// at most `max_threads`. Small calls so get a small block, whose barriers
// are cheaper.
UNIMOE_HD int block_threads(int max_threads, int num_tokens, int num_local, int num_keys) {
  int wanted = num_tokens * kWarp;
  wanted = num_local > wanted ? num_local : wanted;
  wanted = num_keys > wanted ? num_keys : wanted;
  wanted = 4 * kWarp > wanted ? 4 * kWarp : wanted;
  const int whole = (wanted + kWarp - 1) / kWarp * kWarp;
  return whole < max_threads ? whole : max_threads;
}

// Routing CTAs for T tokens: spread over up to max_ctas - 1 CTAs, at
// least `min_tokens` a CTA and at most a warp per token of a block of
// `max_threads`. 1 means the single block serves the call.
inline int cluster_routing_ctas(int max_threads, int num_tokens, int min_tokens,
                                int max_ctas = kClusterMaxCtas) {
  const int kMaxRouting = max_ctas - 1;
  const int spread = (num_tokens + kMaxRouting - 1) / kMaxRouting;
  int per_cta = min_tokens > spread ? min_tokens : spread;
  per_cta = per_cta < max_threads / kWarp ? per_cta : max_threads / kWarp;
  const int ctas = (num_tokens + per_cta - 1) / per_cta;
  return ctas < 1 ? 1 : (ctas > kMaxRouting ? kMaxRouting : ctas);
}

// Tokens of each routing CTA (CTAs 1..) of a cluster of `ctas` CTAs.
UNIMOE_HD int tokens_per_routing_cta(int num_tokens, int ctas) {
  return (num_tokens + ctas - 2) / (ctas - 1);
}

// Whether the cluster kernel runs overlapped (CTA 0 permutes while CTAs 1..
// weigh), given each routing CTA's tokens (tokens_per_routing_cta) and
// warps: a warp for each token and, for the DeepSeek policies, room for all
// its tokens' keys. Otherwise every CTA routes whole tokens before the
// cluster barrier.
UNIMOE_HD bool cluster_overlapped(int per_routing_cta, int warps, bool deepseek, int num_experts) {
  return per_routing_cta <= warps && (!deepseek || per_routing_cta * num_experts <= kWorkWords);
}

// Tokens of each CTA of a cluster of `ctas` where every CTA routes (the
// cluster kernel's way when it is not overlapped).
UNIMOE_HD int tokens_per_cta(int num_tokens, int ctas) { return (num_tokens + ctas - 1) / ctas; }

// The permutation's run of consecutive experts a thread of a block of
// `threads` (at least 1 thread, 1 expert), and the warps whose threads own
// at least one expert: the threads from tid = ceil(E_local / run) on own
// none. The launcher computes both (a kernel's integer division is a chain
// of about 20 dependent instructions).
UNIMOE_HD int experts_per_thread(int num_local, int threads) {
  return (num_local + threads - 1) / threads;
}
UNIMOE_HD int owner_warps(int num_local, int per_thread) {
  const int owners = (num_local + per_thread - 1) / per_thread;
  return (owners + kWarp - 1) / kWarp;
}

// What the routing launcher launches for T tokens of E experts (E_local on
// this rank), `per_lane` experts a lane: the fused variant (cluster false)
// one block; the cluster variant `routing_ctas` routing CTAs besides CTA 0
// (at least `min_tokens` tokens each; 1 means the single block serves the
// call), `threads` a CTA, and whether the cluster kernel runs overlapped
// (it decides the same from its own launch shape).
struct LaunchShape {
  int routing_ctas;
  int threads;
  bool overlapped;
};

inline LaunchShape launch_shape(int per_lane, int num_tokens, int num_local, int num_experts,
                                bool deepseek, bool cluster, int min_tokens,
                                int max_ctas = kClusterMaxCtas) {
  const int max_threads = fused_threads(per_lane);
  LaunchShape c{};
  c.routing_ctas =
      cluster ? cluster_routing_ctas(max_threads, num_tokens, min_tokens, max_ctas) : 1;
  // A warp per token of a routing CTA, and a thread per local expert for
  // the permutation (CTA 0 of a cluster, or the single block).
  const int per_cta = tokens_per_cta(num_tokens, c.routing_ctas);
  c.threads = block_threads(max_threads, per_cta, num_local, deepseek ? per_cta * num_experts : 0);
  c.overlapped = c.routing_ctas > 1 &&
                 cluster_overlapped(tokens_per_routing_cta(num_tokens, c.routing_ctas + 1),
                                    c.threads / kWarp, deepseek, num_experts);
  return c;
}

// The spread cluster kernel (kernels/routing/spread_routing_kernel.cuh,
// spread_routing_permute_kernel): every CTA of a cluster routes a
// contiguous run of tokens, a warp a token, and places its own rows; no CTA
// permutes the others' rows. Each token of a CTA is a bit of one 32-bit
// mask per expert, so a CTA takes at most kSpreadMaxTokensPerCta tokens.
// Clusters above 8 CTAs are non-portable (the H200 runs 16 at 1024 threads
// a CTA; the launcher checks the device and falls back to 8).
inline constexpr int kSpreadMaxTokensPerCta = kWarp;
inline constexpr int kSpreadMaxCtas = 16;
// Each CTA holds every CTA's rows per local expert, a byte each, in a table
// of kSpreadTableBytes: a row of spread_row_bytes a CTA. So the cluster has
// at most kSpreadTableBytes / spread_row_bytes(E_local) CTAs (16 up to
// E_local = 256, 8 at 512, 4 at 1024).
inline constexpr int kSpreadTableBytes = 4096;
UNIMOE_HD int spread_row_bytes(int num_local) { return (num_local + 15) / 16 * 16; }

// Where the cluster variant takes the spread kernel (where it serves) rather
// than CTA 0 permuting every row: from spread_from_tokens tokens. Measured on
// an H200 (198 points DeepSeekV3/Renormalize/TopK, E 64..256, K 1/8, T
// 3..256, against the CTA-0 kernels): geometric means 1.18 (DeepSeek) / 1.16
// (others) at T = 5..16, 1.08 / 1.11 at 17..64, 0.75 / 0.82 at 65..256.
// DeepSeek gains from T=64 (E=256 K=8 6.19 -> 5.63 us, E=128 5.22 -> 4.73;
// E=64 4.16 -> 4.26) and loses below (T=32 5.40 -> 5.64); the others gain
// from T=128 (Renormalize E=128 K=8 4.97 -> 4.08; K=1 3.39 -> 3.55 at E=128,
// the one loss there) and lose at 96 with K=1 (3.08 -> 3.33 at E=64). Below,
// each CTA's scan of the experts after the barrier (about 1,600 cycles: one
// block scan) costs more than CTA 0's permutation saves (a scan over table
// words instead, 3,500-4,000 cycles, gained only from T=192). Its minimum
// tokens a CTA: 2 for the DeepSeek policies, 4 for the others (as the CTA-0
// kernels').
// Only K <= kSpreadMaxTopKByDefault was measured (K = 1, 4, 8); larger K keep
// the CTA-0 kernels unless the threshold is set (UNIMOE_SPREAD_FROM_TOKENS).
inline constexpr int kSpreadMaxTopKByDefault = 8;
// A sweep of T = 16..512 (every policy, E 8..1024) refines it: the DeepSeek
// policies lose from T = 64 at E < 128 (E=8 K=2 T=64 3.10 -> 3.51 us, E=64
// K=1 3.18 -> 3.46), so they start at 128 there; and where the block leaves
// fewer permuting threads than local experts (E = 384 at T=128: 96 threads
// for 384 experts; E = 512), the scan takes runs of experts and loses (TopK
// E=384 K=1 T=128 4.83 -> 7.71), so by default the spread kernel runs only
// with a permuting thread per local expert (spread_by_default).
//
// In clusters of 16 (the DeepSeek policies at E >= 128) the CTA-0 kernel
// beats the spread kernel until its 15 routing CTAs take more than 8 tokens
// each: measured on an H200 (DeepSeekV3 and MiniMax2, E 128/160/256, K 1/4/8,
// T 64..128, the CTA-0 kernel against the spread kernel, best of 3; geometric
// means of 18 points a T): 0.95 at T=64, 0.92 at 72, 0.93 at 80, 0.96 at 96
// (0.88-1.04), 0.98 at 112 (0.92-1.09), 1.08 at 127 and 128 (up to 1.29: 9
// tokens a CTA). DeepSeekV3 E=256 K=8: T=64 5.42 -> 5.54 us (one of the three
// points of T=64 the spread kernel wins), T=72 6.24 -> 5.71, T=96
// 6.33 -> 5.90; E=128 K=1 T=64 4.18 -> 3.79. From 8 * 15 + 1 = 121 the
// geometric mean over those 126 points is 1.004x the best (from 64: 1.044x).
// Where the device does not run those clusters of 16 (`cluster_ctas` 8), the
// CTA-0 kernel's 7 routing CTAs take 10 tokens each at T=64: there the spread
// kernel keeps T = 64.
inline constexpr int kSpreadFromTokensDeepSeek = 64;  // E >= 128, clusters of 8
inline constexpr int kSpreadFromTokensDeepSeekLarge =
    8 * (kClusterMaxCtasNonPortable - 1) + 1;  // E >= 128, clusters of 16
inline constexpr int kSpreadFromTokensOther = 128;
UNIMOE_HD int spread_from_tokens(bool deepseek, int num_experts, int cluster_ctas) {
  if (!deepseek || num_experts < 128) return kSpreadFromTokensOther;
  return cluster_ctas >= kClusterMaxCtasNonPortable ? kSpreadFromTokensDeepSeekLarge
                                                     : kSpreadFromTokensDeepSeek;
}
inline constexpr int kSpreadMinTokensDeepSeek = 2;
inline constexpr int kSpreadMinTokensOther = 4;
UNIMOE_HD int default_spread_min_tokens(bool deepseek) {
  return deepseek ? kSpreadMinTokensDeepSeek : kSpreadMinTokensOther;
}

// Experts a lane of a routing warp holds (the kernels' instantiation): the
// smallest power of two, 1..32, that covers E over 32 lanes.
UNIMOE_HD int slots_for_experts(int num_experts) {
  int slots = 1;
  while (slots * kWarp < num_experts && slots < 32) slots *= 2;
  return slots;
}

// The spread kernel's launch for T tokens: `ctas` CTAs of `threads`
// threads, each routing `tokens_per_cta` tokens (the last CTA what is
// left) with its last tokens_per_cta warps, while threads
// [0, permute_threads) scan the experts and place the CTA's rows. As many
// CTAs as ceil(T / min_tokens) and `max_ctas` allow, the tokens spread
// evenly (T=5 at a minimum of 4: 3 and 2, not 4 and 1), and as the table
// allows; the permuting threads are a thread a local expert where the
// kernel's bound (fused_threads) leaves room, at least a warp; DeepSeek's
// keys of the CTA's tokens (a thread a key where there is room) fit the work
// area. ctas = 0: the spread kernel does not serve the call (one CTA would
// take every token, or a CTA would take more tokens than a mask holds, or the
// keys do not fit, or no warp is left to permute).
struct SpreadShape {
  int ctas;
  int tokens_per_cta;
  int threads;
  int permute_threads;
};

inline SpreadShape spread_shape(int per_lane, int num_tokens, int num_local, int num_experts,
                                bool deepseek, int min_tokens, int max_ctas) {
  SpreadShape s{0, 0, 0, 0};
  if (num_tokens < 2 || min_tokens < 1) return s;
  int ctas = (num_tokens + min_tokens - 1) / min_tokens;
  ctas = ctas < max_ctas ? ctas : max_ctas;
  const int table_ctas = kSpreadTableBytes / spread_row_bytes(num_local);
  ctas = ctas < table_ctas ? ctas : table_ctas;
  if (ctas < 2) return s;
  const int per_cta = (num_tokens + ctas - 1) / ctas;
  const int keys = deepseek ? per_cta * num_experts : 0;
  if (per_cta > kSpreadMaxTokensPerCta || keys > kWorkWords) return s;
  const int routing = per_cta * kWarp;
  int wanted = routing + (num_local + kWarp - 1) / kWarp * kWarp;
  wanted = keys > wanted ? (keys + kWarp - 1) / kWarp * kWarp : wanted;
  const int max_threads = fused_threads(per_lane);
  const int threads = wanted < max_threads ? wanted : max_threads;
  if (threads - routing < kWarp) return s;
  s.ctas = (num_tokens + per_cta - 1) / per_cta;
  s.tokens_per_cta = per_cta;
  s.threads = threads;
  s.permute_threads = threads - routing;
  return s;
}

// Whether the cluster variant takes the spread kernel for a call that it
// serves (`shape`), at the measured defaults: from spread_from_tokens (the
// CTA-0 kernel's cluster for the call `cluster_ctas` CTAs), K at most
// kSpreadMaxTopKByDefault, and a permuting thread per local expert.
UNIMOE_HD bool spread_by_default(const SpreadShape& shape, int num_tokens, int top_k, int num_local,
                                 int num_experts, bool deepseek, int cluster_ctas) {
  return shape.ctas > 0 &&
         num_tokens >= spread_from_tokens(deepseek, num_experts, cluster_ctas) &&
         top_k <= kSpreadMaxTopKByDefault && shape.permute_threads >= num_local;
}

}  // namespace unimoe::routing_shape
