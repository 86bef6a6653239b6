// Sort/permute on the device: topk_ids -> expert counts and offsets, the two
// row maps, and GEMM tile schedules, exactly as the CPU reference
// (ref::permute, ref::make_tiles): rows of an expert in increasing expanded
// index, off-rank rows -1. Graph-safe: no host sync; the number of tiles is
// written to device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/routing_plan.h"
#include "kernels/common/common.cuh"

namespace unimoe {

// One GEMM tile: rows [row_start, row_start + rows) of local expert `expert`.
struct DeviceTile {
  int32_t expert;
  int32_t row_start;
  int32_t rows;
  int32_t pad;
};

inline constexpr int kMaxTileSizes = 3;

struct PermuteParams {
  const int32_t* topk_ids = nullptr;  // [T, K]
  int num_tokens = 0;                 // T
  int top_k = 0;                      // K
  int local_offset = 0;               // first expert of this rank
  int num_local = 0;                  // E_local
  int32_t* expert_counts = nullptr;         // [E_local] out
  int32_t* expert_offsets = nullptr;        // [E_local + 1] out
  int32_t* permuted_to_expanded = nullptr;  // [T * K] out (first offsets[E_local] valid)
  int32_t* expanded_to_permuted = nullptr;  // [T * K] out, -1 off rank
  // Tile schedules, one per tile size (0..kMaxTileSizes).
  int num_tile_sizes = 0;
  int tile_m[kMaxTileSizes] = {};
  DeviceTile* tiles[kMaxTileSizes] = {};  // capacity max_tiles(T*K, E_local, tile_m)
  int32_t* num_tiles[kMaxTileSizes] = {};  // out: tiles written
  void* scratch = nullptr;                 // permute_scratch_bytes(T, K, E_local)
};

// Upper bound on the tiles of one schedule: each expert's rows round up to
// whole tiles, and a tile holds at least one row. (At decode the second
// bound is the tight one: T = 1, K = 8 gives at most 8 tiles, not E_local.)
// At least 1, so that a schedule for no rows still has a buffer.
inline int max_tiles(int rows, int num_local, int tile_m) {
  const int rounded = (rows + tile_m - 1) / tile_m + num_local;
  const int at_least_one = rows > 1 ? rows : 1;
  return at_least_one < rounded ? at_least_one : rounded;
}

// Scratch for any call of at most num_tokens tokens (so a workspace sized
// for a layer's largest T serves every smaller one).
std::size_t permute_scratch_bytes(int num_tokens, int top_k, int num_local);

// The count kernel's work, for a routing kernel that counts the rows
// itself (the routing plan's routing_counts_rows): the expanded rows are cut
// into num_chunks chunks of chunk_rows (the last may be short), each chunk
// into n = routing_shape::octet_count_blocks(K, chunk_rows) runs (at most
// 8), and run j < n of chunk c writes byte j of table[c * num_local + e]:
// its rows of local expert e (local_offset + e); bytes n..7 are not read. `table` is nullptr where the chain has no
// count kernel (up to 2048 expanded rows one kernel counts and scans).
struct PermuteCounts {
  uint64_t* table = nullptr;
  int rows = 0;  // T * K
  int chunk_rows = 0;
  int num_chunks = 0;
  int local_offset = 0;
  int num_local = 0;
};
PermuteCounts permute_counts(const PermuteParams& params);

// The permute chain of the split routing variant, as the plan says
// (plan_routing): count (left out where plan.routing_counts_rows: the
// octet routing kernel wrote permute_counts(params)'s table), scan,
// scatter, with the scan's early trigger and the scatter's token masks
// where the plan takes them. Throws std::invalid_argument for bad params
// or a plan that does not fit them.
void launch_permute(const PermuteParams& params, const RoutingPlan& plan, KernelStream stream);

}  // namespace unimoe
