// The permute chain's constants and how it cuts the expanded rows into
// chunks (Layout, layout, max_chunks), shared by its kernels and its
// launchers. Internal to permute.cu, which alone includes it: an anonymous
// namespace, as there.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/routing_limits.h"
#include "kernels/common/common.cuh"

namespace unimoe {
namespace {

constexpr int kMaxLocalExperts = 1024;
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kCountThreads = 256;
constexpr int kScatterWarps = 8;
constexpr int kScatterThreads = kScatterWarps * kWarpSize;
constexpr int kScanWarps = 32;  // a scan block: 32 experts (a lane each) x 32 spans of chunks
constexpr int kScanThreads = kScanWarps * kWarpSize;
constexpr int kScanBatch = 8;  // chunks a scan thread loads at once
constexpr int kExpertsPerScatterThread = kMaxLocalExperts / kScatterThreads;
// Chunk sizes: enough chunks to fill the GPU (about kTargetChunks), each
// within [kMinChunkRows, kMaxChunkRows] so that the scatter kernel can stage
// a chunk's experts in shared memory. Up to kSmallRows expanded rows the
// chunks are kSmallChunkRows long (at most 64 chunks). Measured on an H200
// (one call, the layer's permute stage, 256-row chunks against 1024): 4096
// rows (T=512, K=8) 10.2 -> 7.4 us on qwen3-30b-a3b, 11.4 -> 8.5 on dsv3-tp8;
// 8192 rows (mixtral-8x7b T=4096) 10.4 -> 7.7; 16384 rows (gpt-oss-120b
// T=4096) 13.7 -> 12.5. At 32768 rows (T=4096, K=8) 128 chunks of 256 lost,
// 12.9 -> 15.9 on qwen3-30b-a3b: the scan's share grows with chunks x
// experts. In the split chain (K = 4, 8, E 128..384, against 1024-row
// chunks), a 512-row minimum, so that 20480 to 98304 rows cut 40 to 128
// chunks instead of 20 to 96, 0.956 (geometric mean over 60 points; 0.90-0.96
// at 24576-65536 rows, e.g. DeepSeekV3 E=256 K=8 T=4096 14.55 -> 13.74 us),
// none slower than 1.006; but more than about 128 chunks lost again (256
// chunks of 512 rows at T*K = 131072 1.01-1.04, 86 of 1536 1.02-1.06).
// The chunk geometry is shared with the host-side plan (core/routing_limits.h).
constexpr int kSmallRows = permute_chunks::kSmallRows;
constexpr int kSmallChunkRows = permute_chunks::kSmallChunkRows;
constexpr int kMinChunkRows = permute_chunks::kMinChunkRows;
constexpr int kMaxChunkRows = permute_chunks::kMaxChunkRows;
static_assert(kScatterThreads == permute_chunks::kScatterThreads, "the plan's chunks are the kernels'");
static_assert(kScanWarps == permute_chunks::kScanExpertsPerCta, "a scan CTA's experts, as the plan counts them");

static_assert(kSmallChunkRows % kScatterThreads == 0, "a chunk is whole pieces for every warp");
static_assert(kMinChunkRows % kScatterThreads == 0, "a chunk is whole pieces for every warp");
static_assert(kMaxChunkRows % kScatterThreads == 0, "a chunk is whole pieces for every warp");
static_assert(kMaxLocalExperts % kScatterThreads == 0, "a scatter thread owns whole experts");
static_assert(kMaxChunkRows / kScatterWarps <= 32767, "a warp's rows of one expert fit int16");
static_assert(kMaxLocalExperts <= 32767, "staged experts are int16");

// How the expanded rows are cut into chunks, and where things lie in the
// scratch; the same for the scratch size and the launch.
struct Layout {
  int rows = 0;        // T * K
  int chunk_rows = 0;  // a multiple of kScatterThreads
  int num_chunks = 0;
  // Scratch, in int32: expert totals [E_local], chunk counts
  // [num_chunks][E_local], then (8-byte aligned) the routing kernel's byte
  // table [num_chunks][E_local] of uint64 (PermuteCounts).
  std::size_t totals = 0;
  std::size_t chunk_counts = 0;
  std::size_t table = 0;
  std::size_t total = 0;
};

int chunk_rows_for(int rows) { return permute_chunks::chunk_rows_for(rows); }

Layout layout(int num_tokens, int top_k, int num_local) {
  Layout l;
  l.rows = num_tokens * top_k;
  l.chunk_rows = chunk_rows_for(l.rows);
  l.num_chunks = ceil_div(l.rows, l.chunk_rows);
  l.totals = 0;
  l.chunk_counts = static_cast<std::size_t>(num_local);
  const std::size_t cells = static_cast<std::size_t>(l.num_chunks) * num_local;
  l.table = (l.chunk_counts + cells + 1) / 2 * 2;
  l.total = l.table + 2 * cells;
  return l;
}

// The most chunks any call of at most `rows` expanded rows cuts: the chunk
// count is not monotone in the rows (it drops where the chunks grow, past
// kSmallRows and past kTargetChunks * kMinChunkRows), and a workspace sized
// for a layer's largest T must hold every smaller call's counts.
int max_chunks(int rows) { return permute_chunks::max_chunks(rows); }

// Local expert of an expanded row, or -1 when it is routed off this rank.
// Any int32 id is safe (-1, E and beyond, INT_MIN: off rank): the
// difference is taken in unsigned arithmetic, where it cannot overflow, and
// an id below local_offset wraps above num_local.
__device__ __forceinline__ int local_expert(const int32_t* topk_ids, int row, int rows,
                                            int local_offset, int num_local) {
  if (row >= rows) return -1;
  const unsigned e = static_cast<unsigned>(topk_ids[row]) - static_cast<unsigned>(local_offset);
  return e < static_cast<unsigned>(num_local) ? static_cast<int>(e) : -1;
}

}  // namespace
}  // namespace unimoe
