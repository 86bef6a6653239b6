// Rules of the split routing chain: weights in batches, sorted runs, the
// octet kernel (where it routes, its filter mode, the permute counts it
// writes). Host and device (UNIMOE_HD). Part of core/routing_launch_shape.h.
#pragma once

#include "core/host_device.h"
#include "core/routing_shape_fused.h"

namespace unimoe::routing_shape {

// What a policy's weight costs the split routing kernel, for
// split_weighs_in_batches: the logit itself (TopK), a share of the row's
// softmax (Default, RenormalizeNaive), an fp64 function of the chosen
// logits (Renormalize and the sigmoid policies), DeepSeek's (an fp64
// sigmoid, a sum over the chosen, a division).
enum class SplitWeight { kLogit, kRowSoftmax, kChosen, kDeepSeek };

// Whether the split routing kernel weighs each block's four tokens together
// (one warp for up to 32 chosen experts) rather than each warp its own
// token's K: from T = split_batch_min_tokens on. Measured on an H200 (batched
// against per-warp weights at every T, 384 points E 64..512, K 1/4/8,
// geometric means): the shared pass saves instructions but adds a block
// barrier's latency, so it pays only where the GPU is full. DeepSeekV3 1.013
// at T=1024, 0.999 at 2048, 0.985 at 3072, 0.936 at 16384; Renormalize 1.003
// at 2048, 0.997 at 3072, 0.990 at 4096, 0.939 at 16384; Default 1.006 at
// 4096, 1.000 at 6144, 0.994 at 8192, 0.982 at 16384; TopK no gain at any T.
// The other policies take the bound of the measured one whose weight is most
// like theirs (not measured). `forced` > 0 (UNIMOE_SPLIT_BATCH_MIN_TOKENS)
// replaces the bound.
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
// heads (routing_device.cuh: rounds_by_sorted_runs, or for DeepSeek's groups
// rounds_by_kept_halves) rather than K rounds of a tree over the slots: at
// most kSortMaxSlots slots a lane, and K above 8, or K from kSortFromTopK
// (DeepSeek kSortFromTopKDeepSeek) and T from kSortFromTokens (DeepSeek
// kSortFromTokensDeepSeek). Measured on an H200 (420 points E 64..512, K
// 4/6/8, T 256..16384, the sort against the tree): the tree wins at K = 4
// and, for the policies other than DeepSeek, at K = 6 (Renormalize K=6
// T=16384 0.917 against 0.935 of the base build); at K = 8 the tree wins
// below T = 2048..3072 (T=1024 0.986-0.990 against 0.994-0.996) and the sort
// above (Renormalize K=8 T=16384 0.924 against 0.940; TopK 0.997 against
// 1.038); DeepSeek's kept halves win from K = 6 and T = 2048 (K=8 T=2048
// 0.985 against 0.998). K above 8 (up to 8 slots) was not measured and keeps
// the sort. `forced_top_k` > 0 (UNIMOE_SPLIT_SORT_FROM_TOPK) sorts from that
// K at every T.
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
// (kernels/routing/routing_octets_kernel.cuh: eight lanes a token, a lane an
// eighth of the experts; a threshold from the kept lanes' second-best keys
// leaves a few candidates a token, ranked in shared memory) rather than a
// warp a token. It serves E = 8 * kPerLane for kPerLane in
// octet_slots_supported (E = 64, 128, 256, 384), K <= kOctetLanes, and
// n_group dividing kOctetLanes (a group one or more whole lanes). Each lane
// computes E / 8 keys where the warp kernel's lanes compute E / 32, so a
// token's chain is longer and the octet kernel pays only where the GPU is
// full: from octets_from_tokens(E, K, grouped) tokens. Measured on an H200
// against the warp kernel (168 points, DeepSeekV3 with 8 groups and MiniMax2,
// E 64..384, K 1/4/8, T 512..16384, an earlier form of the octet kernel):
// grouped, the octets win from T = 4096 (E=256 K=8 18.74 -> 17.74 us; at 3072
// 0.99-1.04) and at E = 384 from 2048 (K=8 17.09 -> 15.68); with one group,
// where the warp kernel has no group stage, from 3072 at E = 384, 4096 at
// E = 256 (K=1 4% behind there, K=4/8 ahead), 8192 at E = 128 and 16384 at
// E = 64. At T=16384: E=256 K=8 34.41 -> 26.91 us (grouped), E=384 K=8
// 63.08 -> 35.78 (the warp kernel's 12 experts a lane take 16 slots). The
// kernel as it is (its row loads issued before its block barrier, its group
// stage compiled for a group a lane, two list entries ranked a pass in the
// exact mode) wins earlier at K = 4 and 8: from T*K = 4096 rows, and 8192 at
// E = 384 with one group. Measured on an H200 (DeepSeekV3 with 8 groups and
// MiniMax2, E 64..384, T 256..16384): every point from the row bound up to
// the token bound 0.79-0.99 of the warp kernel's split chain (DeepSeekV3
// E=256 K=8 T=2048 12.50 -> 10.56 us, T=512 11.13 -> 10.38); one bound lower,
// at T*K = 2048, 1.03-1.20 slower; over the full sweep, the 42 points of
// K = 4 and 8 that the row bound gives to the octets 0.87 and 0.89 by
// geometric mean, none slower. Not at K = 6, where the same row bound
// measured 1.03 slower by geometric mean over 17 points (1.12 at worst,
// MiniMax2 E=256 T=1024): there the octet kernel cannot count the permute's
// rows (octet_count_blocks: 96-row blocks in 256-row chunks), so the chain
// keeps its count kernel. K = 5 and 7 (no count either) and K < 4
// (unmeasured) keep the token bounds. `forced` > 0
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
// threshold) instead of exact keys for every expert. The filter mode issues
// fewer instructions (DeepSeekV3 E=256 K=8 T=16384: 6.39M against 8.65M) but
// a longer chain a warp (the candidates' logits load again), so it pays where
// the GPU is full. Measured on an H200 (against the exact mode, DeepSeekV3
// with 8 groups and MiniMax2, K 1/4/8): grouped, E=256 T=16384 0.90-0.95 (K=8
// 24.50 -> 22.31 us), T=8192 1.00, T=4096 1.08; E=384 0.96 at 8192, 0.85-0.90
// at 16384; E = 64 and 128 1.02-1.12 slower everywhere. With one group:
// E = 256 and 384 0.93-0.98 from 4096 (0.84-0.86 at 16384), E=128 0.95-0.98
// from 8192, E=64 1.02-1.03 slower. 0: never. `forced` > 0
// (UNIMOE_SPLIT_OCTET_FILTER_MIN_TOKENS) replaces the bound.
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

// The octet kernel can do the permute's count kernel's work too: each block
// counts its tokens' rows per local expert and writes them as bytes, byte j
// of (chunk, expert)'s 8-byte word for the chunk's j-th block, and the scan
// sums a word's bytes; the split chain drops the count kernel (measured on an
// H200, DeepSeekV3 E=256 K=8: 0.95-0.97 at T = 4096-8192, 0.99 at 16384).
// That needs a permute chunk of `chunk_rows` expanded rows to be whole octet
// blocks (kOctetTokensPerBlock tokens, K rows each), at most 8 of them (a
// byte each; at most 8 * 16 = 128 rows of an expert, below 256). Returns the
// blocks a chunk, 0 where that does not hold. At K=8 a 1024-row chunk (T*K in
// 16385..131072 rows) is 8 blocks, a 256-row chunk (up to 16384 rows) 2.
inline constexpr int kOctetTokensPerBlock = 16;
inline constexpr int kOctetCountMaxBlocks = 8;
UNIMOE_HD int octet_count_blocks(int top_k, int chunk_rows) {
  const int block_rows = kOctetTokensPerBlock * top_k;
  if (top_k < 1 || chunk_rows < block_rows || chunk_rows % block_rows != 0) return 0;
  const int blocks = chunk_rows / block_rows;
  return blocks <= kOctetCountMaxBlocks ? blocks : 0;
}

}  // namespace unimoe::routing_shape
