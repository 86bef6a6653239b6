// The launch shape of the fused and cluster routing kernels
// (kernels/fused_routing.cu): threads a block, routing CTAs a cluster, and
// which way the cluster kernel routes. Host and device (UNIMOE_HD), no CUDA
// headers: the launcher and the kernel call these, and
// tests/cpu/test_routing_launch_shape.cpp pins the bounds that the GPU tests
// are written against (a GPU test that compares outputs cannot tell which
// way served it).
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
// others at E >= 256, else 8. Measured (session 20 run 3, H200, against 8
// in the same build, T = 5..128, K = 4 and 8): DeepSeekV3 E=256 K=8 T=32
// 5.19 -> 4.42 us, T=48 5.42 -> 4.75, 0.92-0.99 at T = 16..28, 0.84-0.88
// at 32..56; E=128 0.86-0.96 at 32..63, E=512 0.71-0.87 at 32..128; the
// others 0.81-0.98 at E=512 from T=32, 0.97-1.01 at E=256, but 1.03-1.13
// at E=128 from T=36 (a short choice a token: the larger cluster's barrier
// costs more than the fewer tokens a CTA save). T <= 12: 0.99-1.01.
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

// The spread cluster kernel (kernels/spread_routing_kernel.cuh,
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
// than CTA 0 permuting every row: from spread_from_tokens tokens. Measured
// (session 16 run 8, H200, 198 points DeepSeekV3/Renormalize/TopK, E
// 64..256, K 1/8, T 3..256, against the CTA-0 kernels, the final kernel):
// geometric means 1.18 (DeepSeek) / 1.16 (others) at T = 5..16, 1.08 / 1.11
// at 17..64, 0.75 / 0.82 at 65..256. DeepSeek gains from T=64 (E=256 K=8
// 6.19 -> 5.63 us, E=128 5.22 -> 4.73; E=64 4.16 -> 4.26) and loses below
// (T=32 5.40 -> 5.64); the others gain from T=128 (Renormalize E=128 K=8
// 4.97 -> 4.08; K=1 3.39 -> 3.55 at E=128, the one loss there) and lose at
// 96 with K=1 (3.08 -> 3.33 at E=64). Below, each CTA's scan of the experts
// after the barrier (about 1,600 cycles: one block scan) costs more than
// CTA 0's permutation saves. (Session 16 run 5's first kernel, a scan over
// table words, 3,500-4,000 cycles, gained only from T=192.) Its minimum
// tokens a CTA: 2 for the DeepSeek policies, 4 for the others (as the
// CTA-0 kernels').
// Only K <= kSpreadMaxTopKByDefault was measured (K = 1, 4, 8); larger K
// keep the CTA-0 kernels unless the threshold is set
// (UNIMOE_SPREAD_FROM_TOKENS, set_cluster_spread).
inline constexpr int kSpreadMaxTopKByDefault = 8;
// Run 9's sweep of T = 16..512 (every policy, E 8..1024) refined it: the
// DeepSeek policies lose from T = 64 at E < 128 (E=8 K=2 T=64 3.10 ->
// 3.51 us, E=64 K=1 3.18 -> 3.46), so they start at 128 there; and where
// the block leaves fewer permuting threads than local experts (E = 384 at
// T=128: 96 threads for 384 experts; E = 512), the scan takes runs of
// experts and loses (TopK E=384 K=1 T=128 4.83 -> 7.71), so by default the
// spread kernel runs only with a permuting thread per local expert
// (spread_by_default).
//
// Since the CTA-0 kernel runs in clusters of 16 for the DeepSeek policies
// at E >= 128 (session 20), it beats the spread kernel until its 15
// routing CTAs take more than 8 tokens each: measured (session 21 run 1,
// H200, DeepSeekV3 and MiniMax2, E 128/160/256, K 1/4/8, T 64..128, the
// CTA-0 kernel against the spread kernel, best of 3; geometric means of
// 18 points a T): 0.95 at T=64, 0.92 at 72, 0.93 at 80, 0.96 at 96 (0.88-
// 1.04), 0.98 at 112 (0.92-1.09), 1.08 at 127 and 128 (up to 1.29: 9
// tokens a CTA). DeepSeekV3 E=256 K=8: T=64 5.42 -> 5.54 us (one of the
// three points of T=64 the spread kernel wins), T=72 6.24 -> 5.71, T=96
// 6.33 -> 5.90; E=128 K=1 T=64 4.18 -> 3.79. From 8 * 15 + 1 = 121 the
// geometric mean over those 126 points is 1.004x the best (from 64:
// 1.044x). Where
// the device does not run those clusters of 16 (`cluster_ctas` 8), the
// CTA-0 kernel's 7 routing CTAs take 10 tokens each at T=64: there the
// spread kernel keeps T = 64.
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
// kernel's bound (fused_threads) leaves room, at least a warp; DeepSeek's keys of the CTA's tokens (a thread a
// key where there is room) fit the work area. ctas = 0: the spread kernel
// does not serve the call (one CTA would take every token, or a CTA would
// take more tokens than a mask holds, or the keys do not fit, or no warp is
// left to permute).
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

// What a policy's weight costs the split routing kernel, for
// split_weighs_in_batches: the logit itself (TopK), a share of the row's
// softmax (Default, RenormalizeNaive), an fp64 function of the chosen
// logits (Renormalize and the sigmoid policies), DeepSeek's (an fp64
// sigmoid, a sum over the chosen, a division).
enum class SplitWeight { kLogit, kRowSoftmax, kChosen, kDeepSeek };

// Whether the split routing kernel weighs each block's four tokens together
// (one warp for up to 32 chosen experts) rather than each warp its own
// token's K: from T = split_batch_min_tokens on. Measured (session 13 run
// 3, H200, batched against per-warp weights at every T, 384 points E
// 64..512, K 1/4/8, geometric means): the shared pass saves instructions
// but adds a block barrier's latency, so it pays only where the GPU is
// full. DeepSeekV3 1.013 at T=1024, 0.999 at 2048, 0.985 at 3072, 0.936 at
// 16384; Renormalize 1.003 at 2048, 0.997 at 3072, 0.990 at 4096, 0.939 at
// 16384; Default 1.006 at 4096, 1.000 at 6144, 0.994 at 8192, 0.982 at
// 16384; TopK no gain at any T. The other policies take the bound of the
// measured one whose weight is most like theirs (not measured).
// `forced` > 0 (UNIMOE_SPLIT_BATCH_MIN_TOKENS) replaces the bound.
UNIMOE_HD int split_batch_min_tokens(SplitWeight weight) {
  switch (weight) {
    case SplitWeight::kDeepSeek: return 3072;
    case SplitWeight::kChosen: return 4096;
    case SplitWeight::kRowSoftmax: return 8192;
    case SplitWeight::kLogit: break;
  }
  return 0;  // never
}

UNIMOE_HD bool split_weighs_in_batches(int num_tokens, SplitWeight weight, int forced) {
  if (weight == SplitWeight::kLogit) return false;
  return num_tokens >= (forced > 0 ? forced : split_batch_min_tokens(weight));
}

// Whether the split routing kernel sorts each lane's run once and takes K
// heads (routing_device.cuh: rounds_by_sorted_runs, or for DeepSeek's
// groups rounds_by_kept_halves) rather than K rounds of a tree over the
// slots: at most kSortMaxSlots slots a lane, and K above 8, or K from
// kSortFromTopK (DeepSeek kSortFromTopKDeepSeek) and T from
// kSortFromTokens (DeepSeek kSortFromTokensDeepSeek). Measured (session 13
// run 4, H200, 420 points E 64..512, K 4/6/8, T 256..16384, the sort
// against the tree): the tree wins at K = 4 and, for the policies other
// than DeepSeek, at K = 6 (Renormalize K=6 T=16384 0.917 against 0.935 of
// the base build); at K = 8 the tree wins below T = 2048..3072 (T=1024
// 0.986-0.990 against 0.994-0.996) and the sort above (Renormalize K=8
// T=16384 0.924 against 0.940; TopK 0.997 against 1.038); DeepSeek's
// kept halves win from K = 6 and T = 2048 (K=8 T=2048 0.985 against 0.998).
// K above 8 (up to 8 slots) was not measured and keeps the sort.
// `forced_top_k` > 0 (UNIMOE_SPLIT_SORT_FROM_TOPK) sorts from that K at
// every T.
inline constexpr int kSortMaxSlots = 8;
inline constexpr int kSortAlwaysAboveTopK = 8;  // larger K were not measured
inline constexpr int kSortFromTopK = 8;
inline constexpr int kSortFromTopKDeepSeek = 6;
inline constexpr int kSortFromTokens = 3072;
inline constexpr int kSortFromTokensDeepSeek = 2048;
UNIMOE_HD bool split_sorts_runs(int slots, int top_k, int num_tokens, bool deepseek,
                                int forced_top_k) {
  if (slots > kSortMaxSlots) return false;
  if (forced_top_k > 0) return top_k >= forced_top_k;
  if (top_k > kSortAlwaysAboveTopK) return true;
  return deepseek ? top_k >= kSortFromTopKDeepSeek && num_tokens >= kSortFromTokensDeepSeek
                  : top_k >= kSortFromTopK && num_tokens >= kSortFromTokens;
}

// Whether the split chain routes DeepSeek's policies with the octet kernel
// (kernels/routing_octets.cu: eight lanes a token, a lane an eighth of the
// experts; a threshold from the kept lanes' second-best keys leaves a few
// candidates a token, ranked in shared memory) rather than a warp a token.
// It serves E = 8 * kPerLane for kPerLane in octet_slots_supported (E = 64,
// 128, 256, 384), K <= kOctetLanes, and n_group dividing kOctetLanes (a
// group one or more whole lanes). Each lane computes E / 8 keys where the
// warp kernel's lanes compute E / 32, so a token's chain is longer and the
// octet kernel pays only where the GPU is full: from
// octets_from_tokens(E, K, grouped) tokens. Measured (session 14 run 4, H200,
// 168 points, DeepSeekV3 with 8 groups and MiniMax2, E 64..384, K 1/4/8,
// T 512..16384, against the warp kernel): grouped, the octets win from
// T = 4096 (E=256 K=8 18.74 -> 17.74 us; at 3072 0.99-1.04) and at E = 384
// from 2048 (K=8 17.09 -> 15.68); with one group, where the warp kernel
// has no group stage, from 3072 at E = 384, 4096 at E = 256 (K=1 4% behind
// there, K=4/8 ahead), 8192 at E = 128 and 16384 at E = 64. At T=16384:
// E=256 K=8 34.41 -> 26.91 us (grouped), E=384 K=8 63.08 -> 35.78 (the
// warp kernel's 12 experts a lane take 16 slots). Since session 24 (the
// octet kernel's row loads issued before its block barrier, its group
// stage compiled for a group a lane, two list entries ranked a pass in
// the exact mode) it wins earlier at K = 4 and 8: from T*K = 4096 rows,
// and 8192 at E = 384 with one group (run 10, H200, DeepSeekV3 with 8
// groups and MiniMax2, E 64..384, T 256..16384, every point from the new
// bound up to the old one 0.79-0.99 of the warp kernel's split chain:
// DeepSeekV3 E=256 K=8 T=2048 12.50 -> 10.56 us, T=512 11.13 -> 10.38;
// one bound lower, at T*K = 2048, 1.03-1.20 slower; the full sweep of run
// 11: 42 points of K = 4 and 8 newly routed by octets, 0.87 and 0.89 by
// geometric mean, none slower). Not at K = 6, where the same row bound
// measured 1.03 slower by geometric mean over 17 points (1.12 at worst,
// MiniMax2 E=256 T=1024; run 11): there the octet kernel cannot count
// the permute's rows (octet_count_blocks: 96-row blocks in 256-row
// chunks), so the chain keeps its count kernel. K = 5 and 7 (no count
// either) and K < 4 (unmeasured) keep the session 14 bounds. `forced` > 0
// (UNIMOE_SPLIT_OCTETS_MIN_TOKENS) replaces the bound.
inline constexpr int kOctetLanes = 8;
UNIMOE_HD bool octet_slots_supported(int per_lane) {
  return per_lane == 8 || per_lane == 16 || per_lane == 32 || per_lane == 48;
}
UNIMOE_HD int octets_from_tokens(int num_experts, int top_k, bool grouped) {
  int from;
  if (grouped) {
    from = num_experts >= 384 ? 2048 : 4096;
  } else if (num_experts >= 384) {
    from = 3072;
  } else if (num_experts >= 256) {
    from = 4096;
  } else {
    from = num_experts >= 128 ? 8192 : 16384;
  }
  if (top_k == 4 || top_k == 8) {
    const int rows = num_experts >= 384 && !grouped ? 8192 : 4096;
    const int by_rows = (rows + top_k - 1) / top_k;
    from = by_rows < from ? by_rows : from;
  }
  return from;
}
// From how many tokens the octet kernel takes its filter mode (a token's
// logits staged into shared memory by coalesced copies, filter keys from the
// SFU's exp and reciprocal, exact keys only for the candidates near the
// threshold) instead of exact keys for every expert. The filter mode
// issues fewer instructions (DeepSeekV3 E=256 K=8 T=16384: 6.39M against
// 8.65M) but a longer chain a warp (the candidates' logits load again), so
// it pays where the GPU is full. Measured (session 15 run 7, H200, against
// the exact mode, DeepSeekV3 with 8 groups and MiniMax2, K 1/4/8): grouped,
// E=256 T=16384 0.90-0.95 (K=8 24.50 -> 22.31 us), T=8192 1.00, T=4096
// 1.08; E=384 0.96 at 8192, 0.85-0.90 at 16384; E = 64 and 128 1.02-1.12
// slower everywhere. With one group: E = 256 and 384 0.93-0.98 from 4096
// (0.84-0.86 at 16384), E=128 0.95-0.98 from 8192, E=64 1.02-1.03 slower.
// 0: never. `forced` > 0 (UNIMOE_SPLIT_OCTET_FILTER_MIN_TOKENS) replaces
// the bound.
UNIMOE_HD int octet_filter_from_tokens(int num_experts, bool grouped) {
  if (grouped) return num_experts >= 256 ? 8192 : 0;
  if (num_experts >= 256) return 4096;
  return num_experts >= 128 ? 8192 : 0;
}
UNIMOE_HD bool octets_filter(int num_experts, int n_group, int num_tokens, int forced) {
  const int from = forced > 0 ? forced : octet_filter_from_tokens(num_experts, n_group > 1);
  return from > 0 && num_tokens >= from;
}

UNIMOE_HD bool split_takes_octets(bool deepseek, int num_experts, int top_k, int n_group,
                                  int num_tokens, int forced) {
  if (!deepseek || top_k > kOctetLanes || num_experts % kOctetLanes != 0) return false;
  if (!octet_slots_supported(num_experts / kOctetLanes)) return false;
  if (n_group < 1 || n_group > kOctetLanes || kOctetLanes % n_group != 0) return false;
  return num_tokens >= (forced > 0 ? forced : octets_from_tokens(num_experts, top_k, n_group > 1));
}

// The octet kernel can do the permute's count kernel's work too (session
// 18): each block counts its tokens' rows per local expert and writes them
// as bytes, byte j of (chunk, expert)'s 8-byte word for the chunk's j-th
// block, and the scan sums a word's bytes; the split chain drops the count
// kernel (session 18 run 4, DeepSeekV3 E=256 K=8: 0.95-0.97 at T =
// 4096-8192, 0.99 at 16384).
// That needs a permute chunk of `chunk_rows` expanded rows to be whole
// octet blocks (kOctetTokensPerBlock tokens, K rows each), at most 8 of
// them (a byte each; at most 8 * 16 = 128 rows of an expert, below 256).
// Returns the blocks a chunk, 0 where that does not hold. At K=8 a
// 1024-row chunk (T*K in 16385..131072 rows) is 8 blocks, a 256-row chunk
// (up to 16384 rows) 2.
inline constexpr int kOctetTokensPerBlock = 16;
inline constexpr int kOctetCountMaxBlocks = 8;
UNIMOE_HD int octet_count_blocks(int top_k, int chunk_rows) {
  const int block_rows = kOctetTokensPerBlock * top_k;
  if (top_k < 1 || chunk_rows < block_rows || chunk_rows % block_rows != 0) return 0;
  const int blocks = chunk_rows / block_rows;
  return blocks <= kOctetCountMaxBlocks ? blocks : 0;
}

// The decode kernels' K best by a threshold and ranks
// (routing_detail::rounds_by_threshold) rather than K rounds: only in the
// kernels built with it (the launcher takes them where threshold_serves),
// which hold the rounds too, for calls where it does not serve and for
// rows whose candidates pass 32. At least kThresholdMinSlots slots a lane
// (E > 128), K >= kThresholdMinTopK, and the lanes that hold candidates
// (every lane with strided slots; with runs, DeepSeek's, about those of the
// kept groups: topk_group * E / n_group / slots) at least 1.5 K, so that
// the K-th best of their bests leaves few candidates above it.
// Measured (session 17 runs 3, 5, 6 and 7, H200, the decode grid of
// scripts/routing_ab.sh over E 64..1024, K 4..22, T 1..256, against the
// K rounds everywhere; the sweep's DeepSeekV3 keeps 4 of 8 groups; run 7
// the final kernels, geometric means over T):
//   - K = 8: 1-2% faster at E = 256, 6-13% at E = 384..1024 (Renormalize
//     E=384 T=64 5.97 -> 4.84 us, DeepSeekV3 E=384 T=128 12.90 -> 10.64);
//   - K = 16 without groups: 16-29% faster;
//   - slower: K = 4 by 7-11% (its fixed steps cost about four rounds),
//     DeepSeekV3 at K = 16 and 22 by 6-11% (16 kept lanes: candidates pass
//     32 and the rounds follow), K = 22 without groups mixed (0.63-1.18x);
//   - a kernel built with it ran 2-6% slower where it took the rounds (run
//     6), hence the kernels apart.
// At kRankedSlots slots a lane (E = 65..128) the policies without groups
// take it too, from K = kRankedMinTopK, in the form that ranks the list by
// rank_candidates (routing_detail::rounds_by_ranked_threshold). Measured
// (session 30 run 1, scripts/routing_ab.sh -r 3, H200, Renormalize, TopK
// and Default at E = 96 and 128, the same binary with it off and on;
// bench/results/h200-routing-ab-session30.txt): the cluster variant at
// K = 8 0.92-0.95 at T = 1..4 and 12..32 (Renormalize E=128 T=1 2.47 -> 2.28 us,
// T=32 3.01 -> 2.89), 0.98 at T = 48..64; K = 10 and 16 0.79-0.93 at
// every T to 128 where they run (1.00 at 33..64 rows, which keep the
// rounds); K = 6 0.97-0.98 to T = 32 but 1.02-1.04 from T = 48
// (the choice probe, bench/probes/choice_floor.cu: slower from 8 warps a
// block), so K = 6 keeps the rounds; K = 4 slower in the probe.
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

// The fixed choice (kernels/routing_fixed.cuh, choose_deepseek_fixed):
// DeepSeek's decode choice with the shape of DeepSeek-V3/R1 compiled in,
// E = 256 in kFixedGroups groups of 32 (4 lanes of 8 slots), kFixedKept
// kept, and K at most twice the kept groups (their two best keys a group
// reach K). It lives in the threshold kernels of 8 slots a lane, so it
// runs where threshold_serves too: K = 8. Measured (session 29 run 2,
// bench/probes/choice_floor.cu, H200, one warp choosing from staged keys,
// median cycles): 986 against 2,622 for the group stage and
// rounds_by_threshold at one choosing warp a block, 1,081 against 2,647
// at four, 1,221 against 2,883 at five.
inline constexpr int kFixedExperts = 256;
inline constexpr int kFixedGroups = 8;
inline constexpr int kFixedKept = 4;
UNIMOE_HD bool fixed_choice_serves(int num_experts, int n_group, int topk_group, int top_k) {
  return num_experts == kFixedExperts && n_group == kFixedGroups && topk_group == kFixedKept &&
         top_k >= 1 && top_k <= 2 * kFixedKept;
}

// The wide choice of the DeepSeek policies' decode kernels
// (kernels/routing_wide.cuh): E / 32 warps (parts) choose a token, a thread
// an expert, where each group is one part of 32 experts (DeepSeekV3 E=256
// n_group=8). 0 where it does not serve. Measured (session 19 run 5,
// against each token's own warp): DeepSeekV3 E=256 K=8 0.85-0.93 at T =
// 1..12, 0.97-0.98 at T = 16..20, but 1.02-1.03 from 4 tokens a routing CTA
// (T = 24..28, and the spread kernel's T = 64): every part runs the same
// steps, so a CTA's 24-32 busy warps are bound by issue, not by a chain
// (stamps: each phase 1.5-2x longer at 3-4 tokens a CTA than at 1);
// without groups (MiniMax2) 1.05-1.16x slower at E <= 128 and mixed above
// (0.87-1.17), so not there.
UNIMOE_HD int wide_parts(int num_experts, int n_group, int experts_per_group) {
  if (num_experts % kWarp != 0 || num_experts < 2 * kWarp || num_experts > kMaxThreads) return 0;
  if (n_group <= 1 || experts_per_group != kWarp) return 0;
  return num_experts / kWarp;
}

// Where the wide choice runs by default (where it serves: wide_parts > 0):
// parts * K >= kWideMinWork, a long enough warp's chain (it grows with the
// experts a lane and with K). Measured (session 20 run 3, H200, DeepSeekV3
// in groups of 32, topk_group n_group / 2, T = 1..20, against each token's
// own warp in the same build):
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
//   2. Measured (session 20 run 6, H200, against 2 in the same build):
//   DeepSeekV3 E=256 K=8 0.91-0.93 at T = 2..14 (T=5 4.04 -> 3.67 us),
//   E=512 0.87-0.95 (the wide choice seats one token of 16 parts only);
//   without it (E=128) 0.98-1.05;
// - the others: 2 in clusters of 8 (E < 256), else 4. Measured (session
//   20 run 7, Renormalize/Default/TopK/Sigmoid, K = 1..8): E = 8..160
//   0.90-0.99 at T = 3..4 (Renormalize E=128 K=8 3.07 -> 2.62 us), within
//   1.5% beyond; E=256 1.06-1.12 at T = 3..4.
UNIMOE_HD int cluster_min_tokens_by_default(bool deepseek, int num_experts, bool wide) {
  if (deepseek) return wide ? 1 : 2;
  return num_experts < kClusterLargeFromExpertsOther ? 2 : 4;
}

// Where one routing CTA serves a call of the cluster variant (its smallest
// calls), whether it still launches a cluster, of 2 CTAs (CTA 0 permutes,
// CTA 1 routes), rather than the single block: the policies without
// DeepSeek's decode path, at E <= 128. Measured (session 25, H200):
// - run 10, the same binary with and without it: Renormalize E=128 K=8
//   T=1 back to back (the sweep) 2.29 -> 2.42 us, T=2 within 0.03; but
//   after kernels that evict the SMs' instruction caches
//   (`--evict-icache`), as inside a model, the single block's call ends
//   2,000 cycles later than back to back and the cluster's does not (CTA
//   0 done 6,293 against 4,224 cycles after the wait), and the
//   qwen3-30b-a3b layer at T=1 takes 26.7 us against 27.55. DeepSeekV3
//   E=256 (whose single block takes the wide choice) went 3.02 -> 3.55
//   back to back and its dsv3-tp8 layer 30.45 -> 31.4 at T=1: not there.
// - run 11, a full sweep with it for every E: back to back, the cluster
//   variant at T <= 4 without DeepSeek's policies 1.005x at E=128, 1.017
//   at E=8, 1.022 at E=64, but 1.049 at E=256 and 1.077 at E=1024 (T=1
//   3.26 -> 3.95 us), where the cold case was not measured: left out.
inline constexpr int kClusterOfTwoMaxExperts = 128;
UNIMOE_HD bool cluster_of_two_for_one_cta(bool deepseek, int num_experts) {
  return !deepseek && num_experts <= kClusterOfTwoMaxExperts;
}

// The most tokens a block seats: the single block (its decode way, T <= 4
// at E = 256) 4, a routing CTA of the cluster or spread kernels 2. Run 6
// (DeepSeekV3 E=256): the single block 0.82-0.92 at K=8 (T=1 3.70 -> 3.02
// us), 0.92-0.99 at K=4; the cluster at 2 tokens a CTA (T = 5..14) 0.93
// at K=8 and 1.00 at K=4, but at 3 (T = 15..21) 0.98-1.00 at K=8 and
// 1.04-1.05 at K=4.
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
