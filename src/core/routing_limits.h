// Limits and geometry of the routing and permute kernels that the host-side
// plans need too: the largest call the fused (single block or cluster)
// kernels serve, the lanes of a DeepSeek expert group, and how the permute
// chain cuts the expanded rows into chunks. Plain constexpr host code, no
// CUDA headers; the kernels include this file for the same numbers.
#pragma once

#include <algorithm>

namespace unimoe::routing_limits {

// The largest inputs one fused block (or cluster) serves: T * K expanded
// rows and E_local experts.
inline constexpr int kFusedMaxRows = 4096;
inline constexpr int kFusedMaxLocalExperts = 1024;

// Whether the fused and cluster kernels take (T, K, E_local).
constexpr bool fused_routing_fits(int num_tokens, int top_k, int num_local) {
  return num_tokens >= 0 && top_k >= 1 && num_local >= 1 && num_local <= kFusedMaxLocalExperts &&
         static_cast<long long>(num_tokens) * top_k <= kFusedMaxRows;
}

// Lanes of a warp that hold one expert group: the largest power of two with
// n_group * lanes <= 32 (n_group 1..32; the kernels' params and the plan
// both take it from here).
constexpr int lanes_per_group_log2(int n_group) {
  int log2 = 5;
  while (log2 > 0 && (1 << log2) * n_group > 32) --log2;
  return log2;
}

// Whether the split kernel's DeepSeek rounds can compact the kept groups'
// lanes into half a warp (rounds_by_kept_halves): each group a run of whole
// lanes of `per_lane` slots, and the kept groups' lanes at most 16.
constexpr bool compacts_kept_lanes(int n_group, int topk_group, int experts_per_group,
                                   int per_lane) {
  const int log2 = lanes_per_group_log2(n_group);
  return n_group > 1 && experts_per_group == (1 << log2) * per_lane && per_lane % 2 == 0 &&
         (topk_group << log2) <= 16;
}

}  // namespace unimoe::routing_limits

namespace unimoe::permute_chunks {

// The permute chain (count, scan, scatter) cuts the T * K expanded rows into
// chunks, one scatter CTA each: 256-row chunks up to 16384 rows, else about
// 128 chunks of 512..4096 rows. Up to kCountScanRows rows one kernel counts
// and scans. The constants and the measurements behind them:
// docs/routing.md, "The permute chain".
inline constexpr int kScatterThreads = 256;
inline constexpr int kSmallRows = 16384;
inline constexpr int kSmallChunkRows = 256;
inline constexpr int kMinChunkRows = 512;
inline constexpr int kMaxChunkRows = 4096;
inline constexpr int kTargetChunks = 128;
inline constexpr int kCountScanRows = 2048;
// Local experts a scan CTA's warp covers: the scan runs ceil(E_local / 32) CTAs.
inline constexpr int kScanExpertsPerCta = 32;

constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

constexpr int chunk_rows_for(int rows) {
  const int wanted = rows <= kSmallRows
                         ? kSmallChunkRows
                         : std::clamp(ceil_div(rows, kTargetChunks), kMinChunkRows, kMaxChunkRows);
  return ceil_div(wanted, kScatterThreads) * kScatterThreads;
}

constexpr int num_chunks(int rows) { return ceil_div(rows, chunk_rows_for(rows)); }

// The most chunks any call of at most `rows` expanded rows cuts: the count
// is not monotone in the rows (it drops where the chunks grow, past
// kSmallRows and past kTargetChunks * kMinChunkRows), and a workspace sized
// for a layer's largest T must hold every smaller call's counts.
constexpr int max_chunks(int rows) {
  int most = num_chunks(rows);
  for (int edge : {kSmallRows, kTargetChunks * kMinChunkRows})
    if (rows > edge) most = std::max(most, num_chunks(edge));
  return most;
}

}  // namespace unimoe::permute_chunks
