// The permute chain's launchers: its scratch size, the count table a routing
// kernel may fill (permute_counts) and launch_permute. Its kernels live in
// permute_count_scan.cuh and permute_scatter.cuh, its chunk layout in
// permute_layout.cuh.
//
// Sort/permute: topk_ids -> expert counts and offsets, the two row maps and
// the tile schedules (contract: permute.cuh). Fixed launches for a given T
// (three, or two up to kCountScanRows expanded rows), so the chain captures
// once in a CUDA graph:
//   1. count:   each block counts one chunk of expanded rows per expert
//               (left out where the octet routing kernel counted them:
//               `counted`, PermuteCounts; the scan then sums its table);
//   2. scan:    each block takes 32 experts and turns their counts into
//               per-chunk base rows (a scan over the chunks) and totals;
//               up to kCountScanRows rows, one kernel does 1 and 2 (each
//               block reads every row and counts its 32 experts);
//   3. scatter: each block scans the totals into expert offsets and tile
//               bases itself (block 0 writes them out), re-reads its chunk
//               and places every row at its stable rank (rows of an expert
//               in increasing expanded index), and writes its share of the
//               tile schedules.
// Measured with ncu on an H200 (T = 16384, K = 8, E = 256): a one-block scan
// of the 128 x 256 counts takes 11.5 us of such a chain's 23 (the count
// kernel 3.2, the scatter 8.3), hence a scan block per 32 experts.
// With the kernels serialized (DeepSeekV3 E=256 K=8 T=16384): count 2.7, scan
// 3.0, scatter 7.4 us with each kernel's loads all in flight at once, one
// vote a piece instead of two and one scan for the offsets and the first tile
// schedule (9.0 without).
// Globaltimer and clock64 stamps (DeepSeekV3 E=256 K=8 T=16384) put the
// votes' scatter at 5.4 us, 2,770 cycles of them in the votes of pass 1; so
// the calls the octet kernel counted rank by token masks before the scatter's
// wait (permute_scatter_kernel<true>).
// Expanded rows are split into chunks of whole warp pieces, and each chunk
// into one contiguous span per warp, so that ranks come from warp votes (or
// token masks) and per-warp counters in shared memory: no global atomics, the
// same result on every run.
#include <algorithm>

#include "core/exact_quotient.h"
#include "core/permute_launch_shape.h"
#include "core/routing_launch_shape.h"
#include "kernels/common/common.cuh"
#include "kernels/permute/permute.cuh"
#include "kernels/permute/permute_layout.cuh"
#include "kernels/permute/permute_count_scan.cuh"
#include "kernels/permute/permute_scatter.cuh"

namespace unimoe {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("launch_permute: " + message);
}

}  // namespace

std::size_t permute_scratch_bytes(int num_tokens, int top_k, int num_local) {
  const std::size_t cells = static_cast<std::size_t>(max_chunks(num_tokens * top_k)) * num_local;
  // Totals, counts, and the byte table 8-byte aligned (Layout).
  return ((num_local + cells + 1) / 2 * 2 + 2 * cells) * sizeof(int32_t);
}

PermuteCounts permute_counts(const PermuteParams& params) {
  PermuteCounts c;
  const Layout l = layout(params.num_tokens, params.top_k, params.num_local);
  c.rows = l.rows;
  c.chunk_rows = l.chunk_rows;
  c.num_chunks = l.num_chunks;
  c.local_offset = params.local_offset;
  c.num_local = params.num_local;
  if (l.rows > kCountScanRows && reinterpret_cast<uintptr_t>(params.scratch) % 8 == 0 &&
      params.scratch != nullptr)
    c.table = reinterpret_cast<uint64_t*>(static_cast<int32_t*>(params.scratch) + l.table);
  return c;
}

void launch_permute(const PermuteParams& params, const RoutingPlan& plan, KernelStream stream) {
  const bool counted = plan.routing_counts_rows;
  require(params.num_tokens >= 0 && params.top_k > 0 && params.local_offset >= 0,
          "need num_tokens >= 0, top_k > 0 and local_offset >= 0");
  require(params.num_local > 0 && params.num_local <= kMaxLocalExperts,
          "num_local must be 1.." + std::to_string(kMaxLocalExperts));
  require(static_cast<long long>(params.num_tokens) * params.top_k <= (1ll << 30),
          "num_tokens * top_k exceeds 2^30");
  require(params.num_tile_sizes >= 0 && params.num_tile_sizes <= kMaxTileSizes,
          "num_tile_sizes must be 0.." + std::to_string(kMaxTileSizes));
  for (int s = 0; s < params.num_tile_sizes; ++s)
    require(params.tile_m[s] > 0 && params.tiles[s] != nullptr && params.num_tiles[s] != nullptr,
            "each tile size needs tile_m > 0, tiles and num_tiles");
  require(params.scratch != nullptr && params.expert_counts != nullptr &&
              params.expert_offsets != nullptr,
          "scratch, expert_counts and expert_offsets must be set");
  const Layout l = layout(params.num_tokens, params.top_k, params.num_local);
  int32_t* scratch = static_cast<int32_t*>(params.scratch);
  int32_t* chunk_counts = scratch + l.chunk_counts;
  int32_t* totals = scratch + l.totals;

  // The scan and the scatter run for T = 0 too: totals, counts, offsets and
  // tile counts are still written (the scatter with one block and no rows).
  const int scan_blocks = ceil_div(params.num_local, kWarpSize);
  const int table_blocks = routing_shape::octet_count_blocks(params.top_k, l.chunk_rows);
  require(!counted || (l.rows > kCountScanRows && table_blocks > 0 &&
                       permute_counts(params).table != nullptr),
          "counted: only calls of more than " + std::to_string(kCountScanRows) +
              " expanded rows whose chunks are whole octet blocks, with 8-byte aligned scratch "
              "(the plan's routing_counts_rows)");
  // The token masks (only in the calls the octet kernel counted) and the
  // scan's early trigger, as the plan says.
  require(!plan.scatter_masks || counted, "the plan's scatter masks need the octet kernel's counts");
  require(plan.permute_chunks == std::max(l.num_chunks, 1),
          "the plan's permute chunks do not match the call");
  const bool masks = plan.scatter_masks;
  const bool trigger = plan.scan_triggers_scatter;
  // A scan kernel, instantiated with or without the trigger.
  const auto launch_scan = [&](auto with_trigger, auto without_trigger, auto&&... args) {
    launch_pdl(trigger ? with_trigger : without_trigger, scan_blocks, kScanThreads, 0, stream,
               args...);
    UNIMOE_LAUNCH_CHECK();
  };
  if (l.rows <= kCountScanRows) {
    launch_scan(permute_count_scan_kernel<true>, permute_count_scan_kernel<false>, params.topk_ids,
                l.rows, l.num_chunks, params.local_offset, params.num_local, chunk_counts, totals);
  } else if (counted) {
    const uint64_t* table = reinterpret_cast<const uint64_t*>(scratch + l.table);
    launch_scan(permute_scan_table_kernel<true>, permute_scan_table_kernel<false>, l.num_chunks,
                params.num_local, table_blocks, table, chunk_counts, totals);
  } else {
    launch_pdl(permute_count_kernel, l.num_chunks, kCountThreads, 0, stream, params.topk_ids,
               l.rows, l.chunk_rows, params.local_offset, params.num_local, chunk_counts);
    UNIMOE_LAUNCH_CHECK();
    launch_scan(permute_scan_kernel<true>, permute_scan_kernel<false>, l.num_chunks,
                params.num_local, chunk_counts, totals);
  }

  ScatterParams scatter{};
  scatter.topk_ids = params.topk_ids;
  scatter.rows = l.rows;
  scatter.chunk_rows = l.chunk_rows;
  scatter.num_chunks = l.num_chunks;
  scatter.local_offset = params.local_offset;
  scatter.num_local = params.num_local;
  scatter.chunk_base = chunk_counts;
  scatter.totals = totals;
  scatter.expert_counts = params.expert_counts;
  scatter.expert_offsets = params.expert_offsets;
  scatter.permuted_to_expanded = params.permuted_to_expanded;
  scatter.expanded_to_permuted = params.expanded_to_permuted;
  scatter.inv_top_k = inverse_of(params.top_k);
  scatter.num_tile_sizes = params.num_tile_sizes;
  for (int s = 0; s < params.num_tile_sizes; ++s) {
    scatter.tile_m[s] = params.tile_m[s];
    scatter.tiles[s] = params.tiles[s];
    scatter.num_tiles[s] = params.num_tiles[s];
  }
  launch_pdl(masks ? permute_scatter_kernel<true> : permute_scatter_kernel<false>,
             std::max(l.num_chunks, 1), kScatterThreads, 0, stream, scatter);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
