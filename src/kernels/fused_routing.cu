// Routing + sort/permute in one block (contract: fused_routing.cuh). The
// block runs four phases, separated by __syncthreads:
//   1. route: warp w routes tokens w, w + warps, ... with routing.cu's
//      per-token code (routing_device.cuh) and stages each expanded row's
//      local expert in shared memory (precomputed mode stages the given ids);
//   2. count: scatter warp w takes the w-th contiguous span of expanded rows,
//      32 rows a piece in order, and counts its rows per expert
//      (__match_any_sync: the lowest lane of equal experts adds, no atomics);
//   3. scan: expert totals -> counts and offsets, and each (warp, expert)'s
//      first permuted row;
//   4. scatter and tiles: each row goes to its warp's cursor plus its rank
//      among the piece's lanes of the same expert, so the rows of an expert
//      stay in increasing expanded index (the stable order of ref::permute);
//      then every tile schedule, a thread per tile.
// One 32 KB work area serves, in turn, the warps' group keys (DeepSeek: the
// block's selection keys of as many tokens as fit, an expert a thread, which
// the warps then read), the per-warp cursors and the tile bases. Up to 32
// rows (decode), phases 2-4 take a short path with at most one barrier
// (permute_piece); beyond, routed rows place by per-expert token masks
// where they fit the work area (permute_by_token_masks), other inputs by
// the general phases above. The routing kernels let the next kernel launch
// at once (pdl_launch_dependents): its CTAs wait for this one's end on the
// otherwise idle SMs.
//
// The cluster variant spreads phase 1 over the CTAs 1.. of a thread-block
// cluster of up to 8 (cluster_routing_ctas: a few tokens a CTA, since a CTA
// of many routing warps gets slower with its size): routing CTA c takes a
// contiguous run of tokens, a warp a token (DeepSeek policies: it stages
// the run's keys), and stages each row's expert straight into CTA 0's
// shared memory (distributed shared memory). CTA 0 routes nothing: after the
// cluster barrier it alone runs phases 2-4, unchanged, while the routing
// CTAs weigh their experts. Where those CTAs would need more warps than
// they have (large T), every CTA routes whole tokens, CTA 0 too, before the
// barrier.
#include <cooperative_groups.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/exact_quotient.h"
#include "core/routing_launch_shape.h"
#include "kernels/common.cuh"
#include "kernels/fused_routing.cuh"
#include "kernels/routing_device.cuh"
#include "kernels/routing_wide.cuh"

namespace unimoe {
namespace {

using namespace routing_detail;
using routing_shape::fused_threads;
using routing_shape::kMaxThreads;
using routing_shape::kWorkWords;

static_assert(fused_threads(kMaxExperts / kWarpSize) % kWarpSize == 0 &&
                  fused_threads(kMaxExperts / kWarpSize) * (kMaxExperts / kWarpSize) <= kWorkWords,
              "whole warps, whose group keys fit in the work area");
static_assert(kWorkWords / kFusedMaxLocalExperts >= 1, "at least one scatter warp");
static_assert(kWorkWords / kMaxExperts >= 1, "the DeepSeek keys of at least one token fit");
static_assert(kWorkWords >= kMaxTileSizes * (kFusedMaxLocalExperts + 1),
              "every schedule's tile bases fit in the work area");
static_assert(kFusedMaxLocalExperts <= 32767, "staged experts are int16");
static_assert(kMaxThreads / kWarpSize <= 255 && kMaxTopK <= 255,
              "wide_parts and wide_floor_rank fit a byte");
static_assert(kMaxThreads * 4 + 16 + kWideAreaMaxBytes <= kWorkWords * 4,
              "the wide choice's area fits beside the keys of a block's seated tokens");
static_assert(kMaxThreads / kWarpSize <= kWarpSize, "one warp scans the warp totals");

struct BlockPermuteParams {
  const int32_t* topk_ids;  // [rows], precomputed mode only
  int rows;                 // T * K
  int top_k;                // K
  bool distinct_per_token;  // a token's K ids are distinct (routing mode)
  // The DeepSeek kernels' wide choice at decode (routing_wide.cuh): its
  // parts a token, routing_shape::wide_parts; 0: off. A byte in the
  // padding after the bool, so that the struct keeps its size (a larger
  // one is one more line for warm_params to touch in every kernel).
  uint8_t wide_parts;
  // Its floor rank, routing_shape::wide_floor_rank, from the host (the next
  // padding byte): a division on the device sat ahead of the first key
  // load (session 20).
  uint8_t wide_floor_rank;
  int local_offset;
  int num_local;
  int32_t* expert_counts;
  int32_t* expert_offsets;
  int32_t* permuted_to_expanded;
  int32_t* expanded_to_permuted;
  int num_tile_sizes;
  int tile_m[kMaxTileSizes];
  DeviceTile* tiles[kMaxTileSizes];
  int32_t* num_tiles[kMaxTileSizes];
  // Reciprocals that replace the token-mask permutation's integer
  // divisions (exact_quotient).
  float inv_top_k;
  float inv_tile_m[kMaxTileSizes];
  // Cluster launches: routing_shape::tokens_per_routing_cta and
  // tokens_per_cta, from the host, so that no CTA divides before its
  // first load.
  int tokens_per_routing_cta;
  int tokens_per_cta;
  // The permutation's run of experts a thread, and the warps that own
  // experts, for the launch's block size (for_block).
  int experts_per_thread;
  int owner_warps;
};

// p with the fields that depend on the block size, from the host
// (routing_shape::experts_per_thread and owner_warps).
BlockPermuteParams for_block(BlockPermuteParams p, int threads) {
  p.experts_per_thread = routing_shape::experts_per_thread(p.num_local, threads);
  p.owner_warps = routing_shape::owner_warps(p.num_local, p.experts_per_thread);
  return p;
}

struct BlockShared {
  union {
    float keys[kWorkWords];     // phase 1: each warp's group keys
    int32_t words[kWorkWords];  // phases 2-4: cursors [scatter warps][E_local], then tile bases
  } work;
  alignas(16) int16_t expert[kFusedMaxRows];   // local expert of each expanded row, -1 off rank
  int32_t offsets[kFusedMaxLocalExperts + 1];  // expert offsets
  int32_t scan[kWarpSize + 1];                 // block scan: warp bases, then the total
  uint64_t scan64[kWarpSize + 1];              // the same for packed 64-bit sums
#ifdef UNIMOE_ROUTING_STAMPS
  long long stamps[8];  // clock64 at the phases of one call (phase_stamp)
  long long steps[8];   // clock64 at the permutation's steps (step_stamp)
#endif
};

static_assert(sizeof(BlockShared) <= 48 * 1024, "fits static shared memory");

// Development instrumentation, off unless built with the CMake option
// UNIMOE_ROUTING_STAMPS (docs/routing.md, "Phase stamps"): the calling
// thread records clock64 as stamp i of this CTA; at the kernel's end
// print_stamps (every thread calls it) prints one line a CTA (the policy
// as its RoutingPolicy value) with each stamp's cycles since stamp 1 (after
// pdl_begin), 0 where a path did not stamp. Stamps: 0 entry, 1 after
// pdl_begin, 2 DeepSeek keys staged, 3 thread 0 chose its token's experts
// (routed them, in the general path), 4 the last routing warp chose,
// 5 after the barrier that ends routing, 6 thread 0 weighed, 7 the
// permutation done (its lane part, in route_then_permute). A second line,
// ROUTING_STEPS, has the permutation's own steps (step_stamp), where it
// ran: permute_counted_piece 0 counted, 1 the last counting thread
// counted, 2 placed, 3 tiles written; permute_sorted_piece 0 sorted, 1
// after its barrier, 2 placed, 3 tiles written; permute_by_token_masks 0
// masks cleared, 1 set, 2 expert sums, 3 scanned, 4 offsets and tiles
// written, 5 after their barrier, 6 rows placed, 7 the last thread placed
// its rows.
#ifdef UNIMOE_ROUTING_STAMPS
template <class S>
__device__ __forceinline__ void phase_stamp(S& s, int i, bool cond) {
  if (cond) s.stamps[i] = clock64();
}
template <class S>
__device__ __forceinline__ void step_stamp(const S& s, int i, bool cond) {
  if (cond) const_cast<S&>(s).steps[i] = clock64();
}
template <class S>
__device__ void clear_stamps(S& s) {
  if (threadIdx.x == 0)
    for (int i = 0; i < 8; ++i) {
      if (i > 0) s.stamps[i] = 0;
      s.steps[i] = 0;
    }
  __syncthreads();
}
template <class S>
__device__ void print_stamps(S& s, const char* path, const RoutingKernelParams& r, int rank,
                             int ctas) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  long long d[8];
  for (int i = 0; i < 8; ++i) d[i] = s.stamps[i] == 0 ? 0 : s.stamps[i] - s.stamps[1];
  printf("ROUTING_STAMPS path=%s policy=%d T=%d E=%d K=%d cta=%d/%d threads=%d : %lld %lld %lld %lld %lld %lld %lld %lld\n",
         path, static_cast<int>(r.policy), r.num_tokens, r.num_experts, r.top_k, rank, ctas,
         static_cast<int>(blockDim.x), d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]);
  bool any_step = false;
  for (int i = 0; i < 8; ++i) {
    d[i] = s.steps[i] == 0 ? 0 : s.steps[i] - s.stamps[1];
    any_step = any_step || s.steps[i] != 0;
  }
  if (any_step)
    printf("ROUTING_STEPS path=%s policy=%d T=%d E=%d K=%d cta=%d/%d threads=%d : %lld %lld %lld %lld %lld %lld %lld %lld\n",
           path, static_cast<int>(r.policy), r.num_tokens, r.num_experts, r.top_k, rank, ctas,
           static_cast<int>(blockDim.x), d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]);
}
// The wide choice's phase stamps go to steps[4..6] (routing_wide.cuh).
template <class S>
__device__ __forceinline__ long long* wide_steps(S& s) {
  return s.steps;
}
#else
template <class S>
__device__ __forceinline__ long long* wide_steps(S&) {
  return nullptr;
}
template <class S>
__device__ __forceinline__ void phase_stamp(S&, int, bool) {}
template <class S>
__device__ __forceinline__ void step_stamp(const S&, int, bool) {}
template <class S>
__device__ __forceinline__ void clear_stamps(S&) {}
template <class S>
__device__ __forceinline__ void print_stamps(S&, const char*, const RoutingKernelParams&, int,
                                             int) {}
#endif

// Reads a word of every 32 bytes of a __grid_constant__ parameter struct
// and returns their XOR. The kernels call it before pdl_begin, where the
// block waits for the previous kernel anyway, and use the result there
// (warm_params), so that the SM's constant cache holds every line of the
// parameters before the critical path reads them: otherwise each field
// misses, one at a time, where the code first needs it (measured, session
// 11: run twice in one launch, the second run of the body was 300-600
// cycles faster than the first once the parameters were read from the
// constant bank rather than from a local copy made before pdl_begin).
template <typename P>
__device__ __forceinline__ uint32_t touch_params(const P& params) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(&params);
  uint32_t x = 0;
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(P) / sizeof(uint32_t)); i += 8) x ^= words[i];
  return x;
}

// The reads of touch_params, kept (an unused value would be dropped) with
// a store that no value is likely to trigger, into a slot that is written
// before it is ever read.
__device__ __forceinline__ void warm_params(const RoutingKernelParams& r,
                                            const BlockPermuteParams& p, BlockShared& s) {
  if ((touch_params(r) ^ touch_params(p)) == 0x9e3779b9u) s.scan[kWarpSize] = 0;
}

__device__ __forceinline__ int16_t local_expert(int id, const BlockPermuteParams& p) {
  const int e = id - p.local_offset;
  return static_cast<int16_t>(e >= 0 && e < p.num_local ? e : -1);
}

// The whole block meets (__syncthreads), or the threads [0, count) of it
// (whole warps; the others may be busy with something else: named barrier
// 2).
struct WholeBlock {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};
struct FirstThreads {
  int count;
  __device__ __forceinline__ void operator()() const {
    asm volatile("bar.sync 2, %0;" ::"r"(count) : "memory");
  }
};

// Exclusive sum of one value per thread over the block; `total` gets the sum
// of all. Every thread calls it (with FirstThreads{n} as `sync`, the
// threads [0, n) only); s_scan has kWarpSize + 1 entries. Only the
// first `active_warps` warps may pass a nonzero value: the others skip the
// shuffles and only meet the barriers (in a block of 32 warps whose first 4
// hold the values, the idle warps' shuffles would cost more issue cycles
// than the scan itself).
template <typename V, class Barrier = WholeBlock>
__device__ V block_exclusive_sum(V value, V* s_scan, V& total,
                                 int active_warps = kMaxThreads / kWarpSize, Barrier sync = {}) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = min(static_cast<int>(blockDim.x / kWarpSize), active_warps);
  V inclusive = value;
  if (warp < warps) {
#pragma unroll
    for (int d = 1; d < kWarpSize; d *= 2) {
      const V other = __shfl_up_sync(kFullMask, inclusive, d);
      if (lane >= d) inclusive += other;
    }
    if (lane == kWarpSize - 1) s_scan[warp] = inclusive;
  }
  sync();
  if (warp == 0) {
    const V w = lane < warps ? s_scan[lane] : V(0);
    V w_inclusive = w;
#pragma unroll
    for (int d = 1; d < kWarpSize; d *= 2) {
      const V other = __shfl_up_sync(kFullMask, w_inclusive, d);
      if (lane >= d) w_inclusive += other;
    }
    if (lane < warps) s_scan[lane] = w_inclusive - w;
    if (lane == kWarpSize - 1) s_scan[kWarpSize] = w_inclusive;
  }
  sync();
  const V result = warp < warps ? s_scan[warp] + inclusive - value : V(0);
  total = s_scan[kWarpSize];
  sync();  // s_scan may be reused by the next call
  return result;
}

// Scatter warp pieces: rows span_begin.. span_end of s.expert, 32 a piece
// in order; for each, every lane calls f(row, e, same) with e its row's
// expert (-1 past the span or off rank) and `same` the piece's lanes of
// that expert (__match_any_sync).
template <class F>
__device__ __forceinline__ void for_each_piece(const BlockShared& s, int span_begin, int span_end,
                                               int lane, F f) {
  for (int piece = span_begin; piece < span_end; piece += kWarpSize) {
    const int row = piece + lane;
    const int e = row < span_end ? s.expert[row] : -1;
    const unsigned same = __match_any_sync(kFullMask, e);
    f(row, e, same);
  }
}

// Rows of s.expert[0, rows) (rows <= 32) with a local expert below e[n],
// and with e[n], for each of kN experts: 8 rows a 16-byte load (the same
// address across the warp: a broadcast), each row's compares independent
// of the others' (session 11 run 5: against a 2-byte load and a dependent
// add a row, 3-6% faster at T = 1..16).
struct RowsBelow {
  int below;
  int equal;
};

template <int kN>
__device__ __forceinline__ void rows_below(const BlockShared& s, int rows, const int (&e)[kN],
                                           RowsBelow (&out)[kN]) {
#pragma unroll
  for (int n = 0; n < kN; ++n) out[n] = RowsBelow{0, 0};
  const uint4* pieces = reinterpret_cast<const uint4*>(s.expert);
#pragma unroll 1
  for (int first = 0; first < rows; first += 8) {
    const uint4 v = pieces[first / 8];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int x = static_cast<int16_t>(j % 2 == 0 ? w[j / 2] & 0xffffu : w[j / 2] >> 16);
      const bool in = first + j < rows;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        // x is -1 off rank: as unsigned, never below e[n] >= 0.
        out[n].below += in && static_cast<unsigned>(x) < static_cast<unsigned>(e[n]);
        out[n].equal += in && x == e[n];
      }
    }
  }
}

__device__ __forceinline__ RowsBelow rows_below(const BlockShared& s, int rows, int e) {
  const int experts[1] = {e};
  RowsBelow out[1];
  rows_below(s, rows, experts, out);
  return out[0];
}

// Phases 2-4 for at most 16 rows (permute_piece), with no barrier: each
// thread counts the rows below and at its experts straight from s.expert,
// and the first warp, a lane per row, places the rows (rank among the lanes
// of the same expert) and writes the tiles, each expert's first lane its
// expert's. The same outputs as the general path; small inputs (decode) so
// run a short stretch of code. Only the threads from `first_thread` on (a
// multiple of 32) take part; the warps below may be busy with something
// else.
__device__ void permute_counted_piece(const BlockPermuteParams& p, const BlockShared& s,
                                      int first_thread) {
  const int tid = threadIdx.x - first_thread, lane = threadIdx.x % kWarpSize;
  const int num_local = p.num_local, rows = p.rows;
  if (tid < 0) return;
  // An expert a thread; where the threads are fewer than E_local (the
  // warps busy elsewhere), two a thread in one pass over the rows rather
  // than a second serial pass.
  const int stride = blockDim.x - first_thread;
  if (stride >= num_local) {
    if (tid < num_local) {
      const RowsBelow c = rows_below(s, rows, tid);
      p.expert_offsets[tid] = c.below;
      p.expert_counts[tid] = c.equal;
    }
  } else {
#pragma unroll 1
    for (int e = tid; e < num_local; e += 2 * stride) {
      const int experts[2] = {e, e + stride};
      RowsBelow c[2];
      rows_below(s, rows, experts, c);
      p.expert_offsets[e] = c[0].below;
      p.expert_counts[e] = c[0].equal;
      if (experts[1] < num_local) {
        p.expert_offsets[experts[1]] = c[1].below;
        p.expert_counts[experts[1]] = c[1].equal;
      }
    }
  }
  step_stamp(s, 0, tid == 0);
  step_stamp(s, 1, tid == min(stride, num_local) - 1);
  if (tid >= kWarpSize) return;

  const unsigned lanes_below = (1u << lane) - 1u;
  const int row = lane;
  const int e = row < rows ? s.expert[row] : -1;
  // The last offset, every local row, from the warp rather than a second
  // pass over the rows by thread 0 (the block is often exactly E_local wide).
  const unsigned local_rows = __ballot_sync(kFullMask, e >= 0);
  if (lane == 0) p.expert_offsets[num_local] = __popc(local_rows);
  const unsigned same = __match_any_sync(kFullMask, e);
  const int count = __popc(same);
  const int start = e >= 0 ? rows_below(s, rows, e).below : 0;
  if (e >= 0) {
    const int dst = start + __popc(same & lanes_below);
    p.permuted_to_expanded[dst] = row;
    p.expanded_to_permuted[row] = dst;
  } else if (row < rows) {
    p.expanded_to_permuted[row] = -1;
  }
  step_stamp(s, 2, tid == 0);
  const bool first_of_expert = e >= 0 && (same & lanes_below) == 0;
#pragma unroll 1
  for (int t = 0; t < kMaxTileSizes; ++t) {
    if (t >= p.num_tile_sizes) break;
    const int tile_m = p.tile_m[t];
    const int tiles = first_of_expert ? exact_quotient(count - 1, p.inv_tile_m[t]) + 1 : 0;
    // This expert's first tile: the tiles of the lower experts. Lanes from
    // `rows` on hold no row, so only the first `rows`, rounded up to 8, are
    // read (measured, session 8: the loop over all 32 lanes took about 1000
    // of a one-token call's 4000-9000 cycles).
    int base = 0, num_tiles = 0;
    const int lanes_read = (rows + 7) & ~7;
#pragma unroll 1
    for (int first = 0; first < lanes_read; first += 8) {
#pragma unroll
      for (int l = first; l < first + 8; ++l) {
        const int other_e = __shfl_sync(kFullMask, e, l);
        const int other_tiles = __shfl_sync(kFullMask, tiles, l);
        num_tiles += other_tiles;
        if (other_e < e) base += other_tiles;
      }
    }
#pragma unroll 1
    for (int i = 0; i < tiles; ++i) {
      const int row_start = start + i * tile_m;
      p.tiles[t][base + i] = DeviceTile{e, row_start, min(tile_m, start + count - row_start), 0};
    }
    if (lane == 0) *p.num_tiles[t] = num_tiles;
  }
  step_stamp(s, 3, tid == 0);
}

// Barrier among the threads from `first_thread` on (whole warps; the warps
// below may be busy with something else): named barrier 1.
__device__ __forceinline__ void sync_from(int first_thread) {
  asm volatile("bar.sync 1, %0;" ::"r"(static_cast<int>(blockDim.x) - first_thread) : "memory");
}

// Entries of sorted[0, 32) below x, for sorted ascending: a branchless
// binary search (six dependent loads, a broadcast each).
__device__ __forceinline__ int entries_below(const int32_t* sorted, int x) {
  int pos = 0;
#pragma unroll
  for (int step = kWarpSize / 2; step > 0; step /= 2)
    if (sorted[pos + step - 1] < x) pos += step;
  return pos + (sorted[pos] < x);
}

// Phases 2-4 for 17..32 rows (permute_piece): the first warp, a lane per
// row, sorts the rows by (local expert, row) with a bitonic network of
// shuffles; lane i then holds the row that goes to permuted position i (the
// rows of an expert stay in increasing expanded index, the stable order of
// ref::permute) and, where a run of one expert starts, writes its tiles.
// The sorted experts go to shared memory, and after one barrier the other
// threads find their experts' offsets and counts by binary search (the
// first warp too, after its rows, where it is alone). The same outputs as
// the general path. Only the threads from `first_thread` on (a multiple of
// 32) take part; the warps below may be busy with something else.
__device__ void permute_sorted_piece(const BlockPermuteParams& p, BlockShared& s,
                                     int first_thread) {
  const int tid = threadIdx.x - first_thread, lane = threadIdx.x % kWarpSize;
  if (tid < 0) return;
  const int num_local = p.num_local, rows = p.rows;
  int32_t* sorted = s.scan;  // [32]: the sorted rows' local experts, INT_MAX past them
  constexpr uint32_t kOffRank = kFusedMaxLocalExperts;  // after every local expert
  constexpr uint32_t kNoRow = 0xffffffffu;              // after every row
  uint32_t key = kNoRow;
  if (tid < kWarpSize) {
    if (lane < rows) {
      const int e = s.expert[lane];
      key = (e >= 0 ? static_cast<uint32_t>(e) : kOffRank) << 5 | static_cast<uint32_t>(lane);
    }
    // Bitonic sort, ascending over the lanes: unique keys, so no ties.
#pragma unroll
    for (int size = 2; size <= kWarpSize; size *= 2) {
#pragma unroll
      for (int stride = size / 2; stride > 0; stride /= 2) {
        const uint32_t other = __shfl_xor_sync(kFullMask, key, stride);
        const bool ascending = (lane & size) == 0;  // every lane in the last merge
        const bool low = (lane & stride) == 0;
        key = low == ascending ? min(key, other) : max(key, other);
      }
    }
    sorted[lane] = key < (kOffRank << 5) ? static_cast<int>(key >> 5) : INT_MAX;
  }
  step_stamp(s, 0, tid == 0);
  sync_from(first_thread);  // sorted[] complete
  step_stamp(s, 1, tid == 0);

  // Offsets and counts, a thread an expert: the threads after the first
  // warp, where there are any (the first warp places the rows meanwhile).
  const int threads = blockDim.x - first_thread;
  const int first_searcher = threads > kWarpSize ? kWarpSize : 0;
  auto offsets_and_counts = [&] {
#pragma unroll 1
    for (int e = tid - first_searcher; e < num_local; e += threads - first_searcher) {
      const int below = entries_below(sorted, e), through = entries_below(sorted, e + 1);
      p.expert_offsets[e] = below;
      p.expert_counts[e] = through - below;
    }
  };
  if (tid >= kWarpSize) {
    offsets_and_counts();
    return;
  }

  // Lane i: permuted position i.
  const bool local = key < (kOffRank << 5);
  const int e = local ? static_cast<int>(key >> 5) : -1;
  const int row = static_cast<int>(key & 31u);
  const unsigned local_lanes = __ballot_sync(kFullMask, local);  // lanes 0 .. L-1
  const int num_rows = __popc(local_lanes);
  if (local) {
    p.permuted_to_expanded[lane] = row;
    p.expanded_to_permuted[row] = lane;
  } else if (key != kNoRow) {
    p.expanded_to_permuted[row] = -1;
  }
  if (lane == 0) p.expert_offsets[num_local] = num_rows;
  step_stamp(s, 2, tid == 0);
  // Runs of one expert: each starts at a head lane and ends at the next one.
  const int previous_e = __shfl_up_sync(kFullMask, e, 1);
  const bool head = local && (lane == 0 || previous_e != e);
  const unsigned heads_above = __ballot_sync(kFullMask, head) & ~((2u << lane) - 1u);
  const int count = heads_above != 0u ? __ffs(heads_above) - 1 - lane : num_rows - lane;
#pragma unroll 1
  for (int t = 0; t < kMaxTileSizes; ++t) {
    if (t >= p.num_tile_sizes) break;
    const int tile_m = p.tile_m[t];
    const int tiles = head ? exact_quotient(count - 1, p.inv_tile_m[t]) + 1 : 0;
    int inclusive = tiles;  // this expert's first tile: the tiles of the runs before it
#pragma unroll
    for (int d = 1; d < kWarpSize; d *= 2) {
      const int other = __shfl_up_sync(kFullMask, inclusive, d);
      if (lane >= d) inclusive += other;
    }
    const int base = inclusive - tiles;
#pragma unroll 1
    for (int i = 0; i < tiles; ++i)
      p.tiles[t][base + i] = DeviceTile{e, lane + i * tile_m, min(tile_m, count - i * tile_m), 0};
    if (lane == kWarpSize - 1) *p.num_tiles[t] = inclusive;
  }
  step_stamp(s, 3, tid == 0);
  if (first_searcher == 0) offsets_and_counts();
}

// Phases 2-4 for at most 32 rows (decode), by the threads from
// `first_thread` on (a multiple of 32; the warps below may be busy with
// something else): up to 16 rows each thread counts the rows at and below
// its experts (a pass over the rows: no barrier), beyond, one warp sorts
// the rows and the others search the sorted experts (one barrier). Measured
// (session 11 runs 5-7): the sort's fixed cost (about 850 cycles) loses to
// counting at 8 rows (T=1 K=8: 1.04-1.12x slower) and wins where few
// threads count 24-32 rows (Renormalize E=128 K=8 T=3: 3593 -> 3012
// cycles).
constexpr int kCountedPieceMaxRows = 16;

__device__ __forceinline__ void permute_piece(const BlockPermuteParams& p, BlockShared& s,
                                              int first_thread = 0) {
  if (p.rows <= kCountedPieceMaxRows) {
    permute_counted_piece(p, s, first_thread);
  } else {
    permute_sorted_piece(p, s, first_thread);
  }
}

// Packed per-expert sums for the token-mask path: the row count in the low
// 16 bits, then the tiles of each tile size, 16 bits each (rows <=
// kFusedMaxRows, so no field overflows into the next).
constexpr int kFieldBits = 16;
static_assert(kFusedMaxRows < (1 << kFieldBits), "a packed field holds every row count");
static_assert((kMaxTileSizes + 1) * kFieldBits <= 64, "count and tiles pack into 64 bits");

__device__ __forceinline__ int packed_field(uint64_t packed, int field) {
  return static_cast<int>((packed >> (field * kFieldBits)) & ((1u << kFieldBits) - 1u));
}

// An expert's packed sums from its row count.
__device__ __forceinline__ uint64_t packed_sums(const BlockPermuteParams& p, int count) {
  uint64_t packed = static_cast<uint64_t>(count);
  // Unrolled: the sizes' quotients are independent of each other.
#pragma unroll
  for (int t = 0; t < kMaxTileSizes; ++t) {
    const int tiles = count == 0 || t >= p.num_tile_sizes
                          ? 0
                          : exact_quotient(count - 1, p.inv_tile_m[t]) + 1;
    packed |= static_cast<uint64_t>(tiles) << ((t + 1) * kFieldBits);
  }
  return packed;
}

// Expert e's count, offset and tiles of every schedule, from its packed
// sums and `before`, the packed sums of the experts below it (an exclusive
// scan): its first row and first tiles.
__device__ __forceinline__ void write_expert_layout(const BlockPermuteParams& p, int e,
                                                    uint64_t sums, uint64_t before) {
  const int start = packed_field(before, 0), count = packed_field(sums, 0);
  p.expert_offsets[e] = start;
  p.expert_counts[e] = count;
#pragma unroll 1
  for (int t = 0; t < p.num_tile_sizes; ++t) {
    const int base = packed_field(before, t + 1), tile_m = p.tile_m[t];
#pragma unroll 1
    for (int i = 0; i < packed_field(sums, t + 1); ++i) {
      const int row_start = start + i * tile_m;
      p.tiles[t][base + i] = DeviceTile{e, row_start, min(tile_m, start + count - row_start), 0};
    }
  }
}

// The last offset (every local row) and each schedule's tile count, from
// the packed sums of all experts.
__device__ __forceinline__ void write_layout_totals(const BlockPermuteParams& p, uint64_t total) {
  p.expert_offsets[p.num_local] = packed_field(total, 0);
#pragma unroll 1
  for (int t = 0; t < p.num_tile_sizes; ++t) *p.num_tiles[t] = packed_field(total, t + 1);
}

// 32-bit words of one expert's token mask for T tokens.
__host__ __device__ constexpr int mask_words(int num_tokens) { return (num_tokens + 31) / 32; }

// Whether permute_by_token_masks serves p: routing mode (a token's ids are
// distinct, so an expert has at most one row per token) and every expert's
// token mask fits in the work area.
__device__ __forceinline__ bool token_masks_fit(const BlockPermuteParams& p) {
  return p.distinct_per_token &&
         p.num_local * mask_words(exact_quotient(p.rows, p.inv_top_k)) <= kWorkWords;
}

// Phases 2-4 by token masks: bit t of expert e's mask is set when token t
// has a row at e. An expert's count is its mask's popcount, and a row's rank
// among its expert's rows (in increasing expanded index, which for distinct
// ids is increasing token) is the popcount of the bits below its token. One
// block scan of the packed (count, tiles per size) gives every offset and
// tile base. Four barriers and no serial pass over the rows: the rows of
// decode batches (T * K of 33..4096) place in one step. Each step is a
// chain of dependent instructions (a row or an expert a thread), and it is
// their latency, not the issue rate, that sets its time: 500-1000 cycles a
// step at DeepSeekV3 T=16-64 (session 11 stamps), whether 8 or 32 warps run
// it (session 11 run 4).
__device__ void permute_by_token_masks(const BlockPermuteParams& p, BlockShared& s) {
  const int tid = threadIdx.x, threads = blockDim.x;
  const int num_local = p.num_local, rows = p.rows;
  const float inv_top_k = p.inv_top_k;
  const int words = mask_words(exact_quotient(rows, inv_top_k));
  uint32_t* masks = reinterpret_cast<uint32_t*>(s.work.words);  // [num_local][words]
#pragma unroll 1
  for (int i = tid; i < num_local * words; i += threads) masks[i] = 0;
  __syncthreads();
  step_stamp(s, 0, tid == 0);
#pragma unroll 1
  for (int row = tid; row < rows; row += threads) {
    const int e = s.expert[row];
    const int token = exact_quotient(row, inv_top_k);
    if (e >= 0) atomicOr(&masks[e * words + token / 32], 1u << (token % 32));
  }
  __syncthreads();
  step_stamp(s, 1, tid == 0);

  // Each thread owns a run of consecutive experts.
  const int per_thread = p.experts_per_thread;
  const int first = min(tid * per_thread, num_local);
  const int last = min(first + per_thread, num_local);
  auto expert_sums = [&](int e) {
    int count = 0;
#pragma unroll 1
    for (int w = 0; w < words; ++w) count += __popc(masks[e * words + w]);
    return packed_sums(p, count);
  };
  uint64_t mine = 0;
#pragma unroll 1
  for (int e = first; e < last; ++e) mine += expert_sums(e);
  step_stamp(s, 2, tid == 0);
  uint64_t total = 0;
  uint64_t next = block_exclusive_sum(mine, s.scan64, total, p.owner_warps);
  step_stamp(s, 3, tid == 0);
#pragma unroll 1
  for (int e = first; e < last; ++e) {
    const uint64_t sums = expert_sums(e);
    s.offsets[e] = packed_field(next, 0);
    write_expert_layout(p, e, sums, next);
    next += sums;
  }
  if (tid == 0) write_layout_totals(p, total);
  step_stamp(s, 4, tid == 0);
  __syncthreads();
  step_stamp(s, 5, tid == 0);

#pragma unroll 1
  for (int row = tid; row < rows; row += threads) {
    const int e = s.expert[row];
    if (e < 0) {
      p.expanded_to_permuted[row] = -1;
      continue;
    }
    const int token = exact_quotient(row, inv_top_k);
    const uint32_t* mask = masks + e * words;
    int rank = __popc(mask[token / 32] & ((1u << (token % 32)) - 1u));
#pragma unroll 1
    for (int w = 0; w < token / 32; ++w) rank += __popc(mask[w]);
    const int dst = s.offsets[e] + rank;
    p.permuted_to_expanded[dst] = row;
    p.expanded_to_permuted[row] = dst;
  }
  step_stamp(s, 6, tid == 0);
  step_stamp(s, 7, tid == threads - 1);
}

// Phases 2-4 over s.expert[0, rows); every thread of the block calls it.
__device__ void permute_block(const BlockPermuteParams& p, BlockShared& s) {
  if (p.rows <= kWarpSize) {
    permute_piece(p, s);
    return;
  }
  if (token_masks_fit(p)) {
    permute_by_token_masks(p, s);
    return;
  }
  const int tid = threadIdx.x, threads = blockDim.x;
  const int lane = tid % kWarpSize, warp = tid / kWarpSize;
  const unsigned lanes_below = (1u << lane) - 1u;
  const int num_local = p.num_local;
  // As many scatter warps as have counters in the work area and pieces to
  // take (fewer counters to clear and add up for small inputs); each takes
  // a span of whole pieces.
  const int scatter_warps =
      max(1, min(min(threads / kWarpSize, kWorkWords / num_local), (p.rows + kWarpSize - 1) / kWarpSize));
  const int pieces = (p.rows + kWarpSize - 1) / kWarpSize;
  const int span = (pieces + scatter_warps - 1) / scatter_warps * kWarpSize;
  const int span_begin = warp * span;
  const int span_end = min(span_begin + span, p.rows);

  // Phase 2: rows per (scatter warp, expert).
  for (int i = tid; i < scatter_warps * num_local; i += threads) s.work.words[i] = 0;
  __syncthreads();
  if (warp < scatter_warps) {
    int* cursor = s.work.words + warp * num_local;
    for_each_piece(s, span_begin, span_end, lane, [&](int, int e, unsigned same) {
      if (e >= 0 && (same & lanes_below) == 0) cursor[e] += __popc(same);
      __syncwarp();  // the next piece's leader sees this update
    });
  }
  __syncthreads();

  // Phase 3: each thread owns a run of consecutive experts.
  const int per_thread = p.experts_per_thread;
  const int first = min(tid * per_thread, num_local);
  const int last = min(first + per_thread, num_local);
  int mine = 0;
  // Loops over experts and warps stay rolled (here and below): the block runs
  // this code once per call, with its instructions not cached, so code size
  // costs more than loop overhead.
#pragma unroll 1
  for (int e = first; e < last; ++e)
#pragma unroll 1
    for (int w = 0; w < scatter_warps; ++w) mine += s.work.words[w * num_local + e];
  int total = 0;
  int next = block_exclusive_sum(mine, s.scan, total);
#pragma unroll 1
  for (int e = first; e < last; ++e) {
    s.offsets[e] = next;
    p.expert_offsets[e] = next;
    const int start = next;
#pragma unroll 1
    for (int w = 0; w < scatter_warps; ++w) {
      const int n = s.work.words[w * num_local + e];
      s.work.words[w * num_local + e] = next;
      next += n;
    }
    p.expert_counts[e] = next - start;
  }
  if (tid == 0) {
    s.offsets[num_local] = total;
    p.expert_offsets[num_local] = total;
  }
  __syncthreads();

  // Phase 4a: place the rows.
  if (warp < scatter_warps) {
    int* cursor = s.work.words + warp * num_local;
    for_each_piece(s, span_begin, span_end, lane, [&](int row, int e, unsigned same) {
      if (e >= 0) {
        const int dst = cursor[e] + __popc(same & lanes_below);
        p.permuted_to_expanded[dst] = row;
        p.expanded_to_permuted[row] = dst;
      } else if (row < span_end) {
        p.expanded_to_permuted[row] = -1;
      }
      __syncwarp();  // every lane has read its cursor before the leader moves it
      if (e >= 0 && (same & lanes_below) == 0) cursor[e] += __popc(same);
      __syncwarp();
    });
  }
  __syncthreads();  // the cursors are done: the work area takes the tile bases

  // Phase 4b: tile bases of every schedule (the first tile of each expert;
  // empty experts share their successor's), then the tiles.
#pragma unroll 1
  for (int t = 0; t < kMaxTileSizes; ++t) {
    if (t >= p.num_tile_sizes) break;
    int32_t* bases = s.work.words + t * (num_local + 1);
    int my_tiles = 0;
#pragma unroll 1
    for (int e = first; e < last; ++e) {
      const int count = s.offsets[e + 1] - s.offsets[e];
      my_tiles += count == 0 ? 0 : exact_quotient(count - 1, p.inv_tile_m[t]) + 1;
    }
    int num_tiles = 0;
    int base = block_exclusive_sum(my_tiles, s.scan, num_tiles);
#pragma unroll 1
    for (int e = first; e < last; ++e) {
      bases[e] = base;
      const int count = s.offsets[e + 1] - s.offsets[e];
      base += count == 0 ? 0 : exact_quotient(count - 1, p.inv_tile_m[t]) + 1;
    }
    if (tid == 0) {
      bases[num_local] = num_tiles;
      *p.num_tiles[t] = num_tiles;
    }
  }
  __syncthreads();
#pragma unroll 1
  for (int t = 0; t < kMaxTileSizes; ++t) {
    if (t >= p.num_tile_sizes) break;
    const int32_t* bases = s.work.words + t * (num_local + 1);
    const int num_tiles = bases[num_local];
    // Tile i belongs to the last expert whose first tile is <= i.
    for (int i = tid; i < num_tiles; i += threads) {
      int lo = 0, hi = num_local - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (bases[mid] <= i) lo = mid; else hi = mid - 1;
      }
      const int row_start = s.offsets[lo] + (i - bases[lo]) * p.tile_m[t];
      const int rows = min(p.tile_m[t], s.offsets[lo + 1] - row_start);
      p.tiles[t][i] = DeviceTile{lo, row_start, rows, 0};
    }
  }
}

// The experts of `token`, as the fused, cluster and spread kernels choose
// them (every lane of the warp calls it): DeepSeek's keys staged by the
// block and its slots in runs, the others' strided; the K best by
// rounds_by_threshold in the kernels built with it (kThreshold: the
// launcher takes them where routing_shape::threshold_serves). `keys`: as
// choose_experts'.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold>
__device__ __forceinline__ TokenExperts choose_decode(const RoutingKernelParams& r, int token,
                                                      int lane, float* keys) {
  return choose_experts<LogitT, kPerLane, kDeepSeek, kDeepSeek, kDeepSeek, false, false, false,
                        kThreshold>(r, token, lane, keys);
}

// The wide choice (routing_wide.cuh) in a DeepSeek kernel's decode path:
// whether p.wide_parts seats the block's `tokens` tokens, at most
// max_tokens (their keys to be staged in `keys`, a row of E each; the first
// parts at warps first_lead ..), and this warp's plan; made before the keys
// are staged (uniform; off in the other kernels).
struct WideCall {
  bool on;
  WidePlan plan;
};

template <bool kDeepSeek>
__device__ __forceinline__ WideCall plan_wide(const RoutingKernelParams& r,
                                              const BlockPermuteParams& p, float* keys,
                                              int first_lead, int tokens, int max_tokens,
                                              int warp) {
  WideCall call{};
  if constexpr (kDeepSeek) {
    const int parts = p.wide_parts;
    call.on = routing_shape::wide_fits(tokens, parts, static_cast<int>(blockDim.x / kWarpSize),
                                       max_tokens);
    if (call.on)  // off the chain: the keys are not staged yet
      call.plan = WidePlan{
          wide_seat(warp, first_lead, tokens, parts), parts, p.wide_floor_rank,
          wide_area(keys, tokens, r.num_experts, parts)};
  }
  return call;
}

// The wide choice where `call` is on (every thread of the block calls it,
// after the keys are staged): then on lanes k < K of token t's first part
// its k-th expert in `chosen`, as choose_decode leaves it.
template <bool kDeepSeek>
__device__ __forceinline__ bool choose_wide_if_on(const RoutingKernelParams& r, const float* keys,
                                                  const WideCall& call, int lane,
                                                  TokenExperts& chosen, long long* steps) {
  if constexpr (kDeepSeek) {
    if (!call.on) return false;
    const Chosen c = choose_wide(r, keys, call.plan, lane, steps);
    chosen = TokenExperts{c.expert, 0.0f, RowSoftmax{0.0f, 0.0, 0}};
    return true;
  }
  return false;
}

// Phase 1: this warp (this thread its lane `lane`) routes tokens begin +
// first_warp, + warp_stride, ... below end and stages each row's local
// expert in `staged` (this block's s.expert, or CTA 0's in the cluster
// variant). `keys`: as route_token's; with kStagedKeys, row i of E holds
// token begin + i's keys.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kStagedKeys, bool kThreshold>
__device__ __forceinline__ void route_tokens(const RoutingKernelParams& r, const BlockPermuteParams& p,
                                             float* keys, int16_t* staged, int lane, int begin,
                                             int end, int first_warp, int warp_stride) {
  for (int token = begin + first_warp; token < end; token += warp_stride) {  // uniform per warp
    float* token_keys = kStagedKeys ? keys + (token - begin) * r.num_experts : keys;
    const TokenChoice choice =
        route_token<LogitT, kPerLane, kDeepSeek, kStagedKeys, kDeepSeek, false, false, false,
                    kThreshold>(r, token, lane, token_keys);
    if (lane < r.top_k) {
      const int row = token * r.top_k + lane;
      r.topk_ids[row] = choice.expert;
      r.topk_weights[row] = choice.weight;
      staged[row] = local_expert(choice.expert, p);
    }
    __syncwarp();  // the next token's group keys overwrite this one's
  }
}

// DeepSeek's selection keys of tokens [begin, end), E a row, computed by the
// whole block, an expert a thread: one exp each rather than E / 32 in a row
// on one lane, and a short stretch of code (the lane-unrolled form is
// several KB that a cold instruction cache fetches once per call). Each
// thread loads kKeyBatch logits (and biases) before it computes any key, so
// a thread with several keys waits for one load round trip, not one per key.
constexpr int kKeyBatch = 4;

template <typename LogitT>
__device__ void stage_deepseek_keys(const RoutingKernelParams& r, int begin, int end, float* keys) {
  const int num_experts = r.num_experts, threads = blockDim.x;
  const LogitT* logits =
      static_cast<const LogitT*>(r.logits) + static_cast<size_t>(begin) * num_experts;
  const int n = (end - begin) * num_experts;
  // x % E by exact_quotient: two integer divisions here stood between the
  // kernel's start and its first load (session 12 run 4, Nsight Compute:
  // about 20 dependent instructions each).
  const auto mod_experts = [&](int x) {
    return x - exact_quotient(x, r.inv_num_experts) * num_experts;
  };
  if (n <= threads) {  // one key a thread at most (decode): the short path
    const int i = threadIdx.x;
    if (i < n) {
      const float x = load_logit(logits, i);
      const float bias = r.bias != nullptr ? r.bias[mod_experts(i)] : 0.0f;
      keys[i] = deepseek_key(nan_to_neg_inf(x), bias);
    }
    return;
  }
  const int step = mod_experts(threads);  // e = i % E, kept without dividing
  int e = mod_experts(threadIdx.x);
#pragma unroll 1
  for (int base = threadIdx.x; base < n; base += kKeyBatch * threads) {
    float x[kKeyBatch], bias[kKeyBatch];
#pragma unroll
    for (int j = 0; j < kKeyBatch; ++j) {
      const int i = base + j * threads;
      x[j] = i < n ? load_logit(logits, i) : 0.0f;
      bias[j] = i < n && r.bias != nullptr ? r.bias[e] : 0.0f;
      e += step;
      if (e >= num_experts) e -= num_experts;
    }
#pragma unroll
    for (int j = 0; j < kKeyBatch; ++j) {
      const int i = base + j * threads;
      if (i < n) keys[i] = deepseek_key(nan_to_neg_inf(x[j]), bias[j]);
    }
  }
}

// Phase 1 for DeepSeek policies: this block routes tokens [begin, end), as
// many at a time as the work area holds keys for (at least 8), the block
// staging their keys first. Every thread calls it with the same range.
template <typename LogitT, int kPerLane, bool kThreshold>
__device__ void route_deepseek_tokens(const RoutingKernelParams& r, const BlockPermuteParams& p,
                                      BlockShared& s, int16_t* staged, int begin, int end) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int chunk = exact_quotient(kWorkWords, r.inv_num_experts);
#pragma unroll 1
  for (int first = begin; first < end; first += chunk) {
    const int last = min(first + chunk, end);
    stage_deepseek_keys<LogitT>(r, first, last, s.work.keys);
    __syncthreads();
    route_tokens<LogitT, kPerLane, true, true, kThreshold>(r, p, s.work.keys, staged, lane, first,
                                                           last, warp, warps);
    __syncthreads();  // the next chunk's keys overwrite these
  }
}

// Whether route_then_permute serves this call: at most 32 rows (the
// one-piece permutation), a warp for each token and at least one to spare,
// and for DeepSeek every token's keys staged at once.
__device__ __forceinline__ bool weights_beside_permute(const RoutingKernelParams& r,
                                                       const BlockPermuteParams& p, bool deepseek) {
  return p.rows <= kWarpSize && r.num_tokens < static_cast<int>(blockDim.x / kWarpSize) &&
         (!deepseek || r.num_tokens * r.num_experts <= kWorkWords);
}

// Decode calls (weights_beside_permute): warp t < T chooses token t's
// experts and stages them; after one barrier it weighs them while the other
// warps build the permutation, which needs only the experts. The weights
// (fp64 exp, sums and divisions: about 1200 of a one-token call's cycles,
// measured with clock64 stamps in session 8) then no longer run before the
// permutation.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold, bool kWide>
__device__ void route_then_permute(const RoutingKernelParams& r, const BlockPermuteParams& p,
                                   BlockShared& s, int lane, int warp) {
  const WideCall wide_call = plan_wide<kDeepSeek && kWide>(
      r, p, s.work.keys, 0, r.num_tokens, routing_shape::kWideMaxTokensBlock, warp);
  if constexpr (kDeepSeek) {
    stage_deepseek_keys<LogitT>(r, 0, r.num_tokens, s.work.keys);
    __syncthreads();
    phase_stamp(s, 2, threadIdx.x == 0);
  }
  const int token = warp, top_k = r.top_k;
  const bool routes = token < r.num_tokens;  // uniform per warp
  TokenExperts chosen{};
  const bool wide =
      choose_wide_if_on<kDeepSeek && kWide>(r, s.work.keys, wide_call, lane, chosen,
                                            wide_steps(s));
  if (routes) {
    float* keys = kDeepSeek ? s.work.keys + token * r.num_experts
                            : s.work.keys + warp * kPerLane * kWarpSize;
    if (!wide)
      chosen = choose_decode<LogitT, kPerLane, kDeepSeek, kThreshold>(r, token, lane, keys);
    if (lane < top_k) {
      r.topk_ids[token * top_k + lane] = chosen.expert;
      s.expert[token * top_k + lane] = local_expert(chosen.expert, p);
    }
  }
  phase_stamp(s, 3, threadIdx.x == 0);
  phase_stamp(s, 4, threadIdx.x == (r.num_tokens - 1) * kWarpSize);
  __syncthreads();
  phase_stamp(s, 5, threadIdx.x == 0);
  if (routes) {
    const float weight = weigh_experts<LogitT, kDeepSeek>(r, chosen, token, lane < r.top_k);
    if (lane < top_k) r.topk_weights[token * top_k + lane] = weight;
    phase_stamp(s, 6, threadIdx.x == 0);
  } else {
    permute_piece(p, s, r.num_tokens * kWarpSize);
    phase_stamp(s, 7, threadIdx.x == r.num_tokens * kWarpSize);
  }
}

template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold, bool kWide = false>
__global__ void __launch_bounds__(fused_threads(kPerLane), 1)
    fused_routing_permute_kernel(const __grid_constant__ RoutingKernelParams r,
                                 const __grid_constant__ BlockPermuteParams p) {
  __shared__ BlockShared s;
  phase_stamp(s, 0, threadIdx.x == 0);
  clear_stamps(s);
  warm_params(r, p, s);
  pdl_begin();
  pdl_launch_dependents();
  phase_stamp(s, 1, threadIdx.x == 0);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  if (weights_beside_permute(r, p, kDeepSeek)) {  // uniform
    route_then_permute<LogitT, kPerLane, kDeepSeek, kThreshold, kWide>(r, p, s, lane, warp);
    print_stamps(s, "beside", r, 0, 1);
    return;
  }
  if constexpr (kDeepSeek) {
    route_deepseek_tokens<LogitT, kPerLane, kThreshold>(r, p, s, s.expert, 0, r.num_tokens);
  } else {
    float* group_keys = s.work.keys + warp * kPerLane * kWarpSize;
    route_tokens<LogitT, kPerLane, false, false, kThreshold>(r, p, group_keys, s.expert, lane, 0,
                                                             r.num_tokens, warp, warps);
  }
  phase_stamp(s, 3, threadIdx.x == 0);
  __syncthreads();
  phase_stamp(s, 5, threadIdx.x == 0);
  permute_block(p, s);
  phase_stamp(s, 7, threadIdx.x == 0);
  print_stamps(s, "block", r, 0, 1);
}

// The cluster variant (launched with a cluster of gridDim.x CTAs), two
// ways:
//   - overlapped, where the CTAs 1.. take every token with a warp each
//     (and, DeepSeek, stage all their tokens' keys at once: up to
//     kWorkWords / E tokens, 32 at E = 256): CTA 0 routes no token, so that
//     the routing CTAs weigh their experts while it permutes. They stage
//     each row's expert into CTA 0's shared memory, arrive at the cluster
//     barrier (release) and only then weigh; CTA 0 waits at the barrier
//     (acquire) and permutes.
//   - otherwise (large T), every CTA, CTA 0 too, routes a run of tokens
//     whole (experts and weights) before the barrier, and CTA 0 then
//     permutes: more CTAs route, each warp fewer tokens.
// Every thread arrives once and waits once.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold, bool kWide = false>
__global__ void __launch_bounds__(fused_threads(kPerLane), 1)
    cluster_routing_permute_kernel(const __grid_constant__ RoutingKernelParams r,
                                   const __grid_constant__ BlockPermuteParams p) {
  __shared__ BlockShared s;
  phase_stamp(s, 0, threadIdx.x == 0);
  clear_stamps(s);
  warm_params(r, p, s);
  pdl_begin();
  pdl_launch_dependents();
  phase_stamp(s, 1, threadIdx.x == 0);
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int ctas = static_cast<int>(cluster.num_blocks());
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  int16_t* staged = cluster.map_shared_rank(s.expert, 0);  // CTA 0's rows
  // routing_shape::cluster_overlapped, written out: called, it changed the
  // SASS of the E <= 32 kernels (session 10), and this form is the one
  // measured on the H200. The CPU tests pin the header's form
  // (tests/cpu/test_routing_launch_shape.cpp).
  const int per_routing_cta = p.tokens_per_routing_cta;
  const bool overlapped = per_routing_cta <= warps &&
                          (!kDeepSeek || per_routing_cta * r.num_experts <= kWorkWords);  // uniform
  if (!overlapped) {
    const int per_cta = p.tokens_per_cta;  // a contiguous run a CTA
    const int begin = min(rank * per_cta, r.num_tokens);
    const int end = min(begin + per_cta, r.num_tokens);
    if constexpr (kDeepSeek) {
      route_deepseek_tokens<LogitT, kPerLane, kThreshold>(r, p, s, staged, begin, end);
    } else {
      float* group_keys = s.work.keys + warp * kPerLane * kWarpSize;
      route_tokens<LogitT, kPerLane, false, false, kThreshold>(r, p, group_keys, staged, lane, begin,
                                                               end, warp, warps);
    }
    phase_stamp(s, 3, threadIdx.x == 0);
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
    phase_stamp(s, 5, threadIdx.x == 0);
    if (rank == 0) permute_block(p, s);
    phase_stamp(s, 7, threadIdx.x == 0);
    print_stamps(s, "cluster-whole", r, rank, ctas);
    return;
  }
  if (rank == 0) {
    __cluster_barrier_arrive();
    __cluster_barrier_wait();  // every routed row staged in s.expert
    phase_stamp(s, 5, threadIdx.x == 0);
    permute_block(p, s);
    phase_stamp(s, 7, threadIdx.x == 0);
    print_stamps(s, "cluster", r, rank, ctas);
    return;
  }
  const int begin = min((rank - 1) * per_routing_cta, r.num_tokens);
  const int end = min(begin + per_routing_cta, r.num_tokens);
  const WideCall wide_call = plan_wide<kDeepSeek && kWide>(
      r, p, s.work.keys, 0, end - begin, routing_shape::kWideMaxTokensCluster, warp);
  if constexpr (kDeepSeek) {
    stage_deepseek_keys<LogitT>(r, begin, end, s.work.keys);
    __syncthreads();
    phase_stamp(s, 2, threadIdx.x == 0);
  }
  const int token = begin + warp;
  const bool routes = token < end;  // uniform per warp
  TokenExperts chosen{};
  const bool wide =
      choose_wide_if_on<kDeepSeek && kWide>(r, s.work.keys, wide_call, lane, chosen,
                                            wide_steps(s));
  if (routes) {
    float* keys = kDeepSeek ? s.work.keys + (token - begin) * r.num_experts
                            : s.work.keys + warp * kPerLane * kWarpSize;
    if (!wide)
      chosen = choose_decode<LogitT, kPerLane, kDeepSeek, kThreshold>(r, token, lane, keys);
    if (lane < r.top_k) staged[token * r.top_k + lane] = local_expert(chosen.expert, p);
  }
  phase_stamp(s, 3, threadIdx.x == 0);
  phase_stamp(s, 4, threadIdx.x == (end - begin - 1) * kWarpSize);
  // Release: the staged rows, to CTA 0. The ids go to global memory only
  // after it, with the weights: the release waits for the CTA's earlier
  // stores, and CTA 0 needs only the staged rows.
  __cluster_barrier_arrive();
  if (routes) {
    const float weight = weigh_experts<LogitT, kDeepSeek>(r, chosen, token, lane < r.top_k);
    if (lane < r.top_k) {
      r.topk_ids[token * r.top_k + lane] = chosen.expert;
      r.topk_weights[token * r.top_k + lane] = weight;
    }
  }
  phase_stamp(s, 6, threadIdx.x == 0);
  __cluster_barrier_wait();
  print_stamps(s, "cluster", r, rank, ctas);
}

// The spread cluster kernel's shared memory: DeepSeek's staged keys (or each
// routing warp's group keys); for the CTA's own rows their local experts
// and a token mask per expert; every CTA's rows per expert, a byte each,
// that the CTAs store here (`table`, a row of E_local rounded up to 16
// bytes a CTA); and each expert's first row for this CTA (`base`).
struct SpreadShared {
  float keys[kWorkWords];
  alignas(16) uint32_t mask[kFusedMaxLocalExperts];  // bit t: the CTA's token t has a row at the expert
  int32_t base[kFusedMaxLocalExperts];
  alignas(16) uint8_t table[routing_shape::kSpreadTableBytes];  // [CTA][expert]
  int16_t rows[routing_shape::kSpreadMaxTokensPerCta * kMaxTopK];  // [token of the CTA][k]
  uint64_t scan64[kWarpSize + 1];
  uint32_t sink;  // warm_params' store
#ifdef UNIMOE_ROUTING_STAMPS
  long long stamps[8];  // as BlockShared's
  long long steps[8];
#endif
};

static_assert(sizeof(SpreadShared) <= 48 * 1024, "fits static shared memory");
static_assert(routing_shape::kSpreadMaxTokensPerCta <= 32, "a CTA's tokens are bits of one word");
static_assert(routing_shape::kSpreadMaxTokensPerCta <= 255, "a CTA's rows of an expert fit a byte");
static_assert(routing_shape::kSpreadMaxCtas * routing_shape::kSpreadMaxTokensPerCta < (1 << 16),
              "an expert's rows over the cluster fit 16 bits");

// Stores 16 bytes at `local` (an address of this CTA's shared memory) into
// the shared memory of the cluster's CTA `rank`; the cluster barrier's
// release orders it.
__device__ __forceinline__ void cluster_store(const void* local, int rank, uint4 v) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address), "r"(rank));
  asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(remote), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// The CTA's rows of experts 16 j .. 16 j + 15, a byte each: the popcounts
// of their token masks.
__device__ __forceinline__ uint4 chunk_of_counts(const SpreadShared& s, int j) {
  const uint4* masks = reinterpret_cast<const uint4*>(s.mask) + 4 * j;
  uint32_t word[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 m = masks[q];
    word[q] = __popc(m.x) | __popc(m.y) << 8 | __popc(m.z) << 16 | __popc(m.w) << 24;
  }
  return make_uint4(word[0], word[1], word[2], word[3]);
}

// The spread variant (launched as one cluster; routing_shape::spread_shape):
// CTA c routes tokens [c * n, (c + 1) * n) with its last n warps, a warp a
// token, while its first threads wait to permute. A routing lane stages its
// row's local expert and sets its token's bit in the expert's mask; then the
// routing threads store the CTA's rows per expert (a byte each, the masks'
// popcounts, 16 bytes a store) into every CTA's table. After the cluster
// barrier each CTA sums its table: every expert's rows over the cluster
// (its offset is a scan over the experts) and the rows of the lower CTAs,
// so a row's place is
//   offset(e) + rows of e in lower CTAs + rows of e of earlier tokens here,
// the last a popcount of the mask: the rows of an expert stay in increasing
// expanded index (ref::permute's stable order), with no CTA permuting
// another's rows. The permuting threads scan the experts (a run each, a
// column of the table an expert); CTA 0 writes the counts, offsets and tile
// schedules. The routing warps weigh their experts while the barrier
// completes. Two
// cluster barriers: the first (arrived at the start) keeps every store
// after every CTA has started; the second publishes the stores, masks and
// staged rows, and keeps each CTA's shared memory alive until no other CTA
// stores into it.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold, bool kWide = false>
__global__ void __launch_bounds__(fused_threads(kPerLane), 1)
    spread_routing_permute_kernel(const __grid_constant__ RoutingKernelParams r,
                                  const __grid_constant__ BlockPermuteParams p) {
  __shared__ SpreadShared s;
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int num_local = p.num_local;
  const int row_bytes = routing_shape::spread_row_bytes(num_local);
#pragma unroll 1
  for (int e = tid; e < row_bytes; e += blockDim.x) s.mask[e] = 0;
  // Every mask cleared before a routing lane sets its bit (the DeepSeek
  // policies meet again after staging their keys, the others would not).
  __syncthreads();
  phase_stamp(s, 0, tid == 0);
  clear_stamps(s);
  __cluster_barrier_arrive();  // the first barrier: every CTA started before any store
  if ((touch_params(r) ^ touch_params(p)) == 0x9e3779b9u) s.sink = 0;  // warm_params
  pdl_begin();
  pdl_launch_dependents();
  phase_stamp(s, 1, tid == 0);
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int ctas = static_cast<int>(cluster.num_blocks());
  const int per_cta = p.tokens_per_cta, top_k = r.top_k;
  const int begin = min(rank * per_cta, r.num_tokens);
  const int end = min(begin + per_cta, r.num_tokens);
  const int permute_threads = blockDim.x - per_cta * kWarpSize;
  const WideCall wide_call =
      plan_wide<kDeepSeek && kWide>(r, p, s.keys, permute_threads / kWarpSize, end - begin,
                                    routing_shape::kWideMaxTokensCluster, warp);
  if constexpr (kDeepSeek) {
    stage_deepseek_keys<LogitT>(r, begin, end, s.keys);
    __syncthreads();
    phase_stamp(s, 2, tid == 0);
  }

  // The wide choice seats the routing warps as the tokens' first parts and
  // takes the permuting warps' help (they permute only after the cluster
  // barrier).
  TokenExperts chosen{};
  const bool wide =
      choose_wide_if_on<kDeepSeek && kWide>(r, s.keys, wide_call, lane, chosen, wide_steps(s));
  if (tid >= permute_threads) {  // uniform per warp
    const int t = warp - permute_threads / kWarpSize, token = begin + t;
    const bool routes = token < end;
    if (routes) {
      float* keys = kDeepSeek ? s.keys + t * r.num_experts : s.keys + t * kPerLane * kWarpSize;
      if (!wide)
      chosen = choose_decode<LogitT, kPerLane, kDeepSeek, kThreshold>(r, token, lane, keys);
      if (lane < top_k) {
        const int e = local_expert(chosen.expert, p);
        s.rows[t * top_k + lane] = static_cast<int16_t>(e);
        if (e >= 0) atomicOr(&s.mask[e], 1u << t);
      }
    }
    phase_stamp(s, 3, tid == permute_threads);
    step_stamp(s, 2, tid == static_cast<int>(blockDim.x) - kWarpSize);
    const int routing_threads = per_cta * kWarpSize;
    asm volatile("bar.sync 3, %0;" ::"r"(routing_threads) : "memory");  // every mask set
    __cluster_barrier_wait();  // every CTA started
    const int chunks = row_bytes / 16;
#pragma unroll 1
    for (int i = tid - permute_threads; i < chunks * ctas; i += routing_threads) {
      const int c = i / chunks, j = i - c * chunks;
      cluster_store(s.table + rank * row_bytes + 16 * j, c, chunk_of_counts(s, j));
    }
    __cluster_barrier_arrive();  // the second barrier: rows, masks and tables published
    phase_stamp(s, 4, tid == permute_threads);
    if (routes) {
      const float weight = weigh_experts<LogitT, kDeepSeek>(r, chosen, token, lane < top_k);
      if (lane < top_k) {
        r.topk_ids[token * top_k + lane] = chosen.expert;
        r.topk_weights[token * top_k + lane] = weight;
      }
    }
    step_stamp(s, 0, tid == permute_threads);
    __cluster_barrier_wait();  // no CTA stores into this one any more
    step_stamp(s, 1, tid == permute_threads);
    print_stamps(s, "spread", r, rank, ctas);
    return;
  }

  __cluster_barrier_wait();
  __cluster_barrier_arrive();
  __cluster_barrier_wait();  // every CTA's rows in the table
  phase_stamp(s, 5, tid == 0);
  // Each permuting thread owns a run of experts (p.experts_per_thread: one
  // where the block has a permuting thread per expert) and sums each one's
  // column of the table over the CTAs, and over the CTAs below this one;
  // then one scan over the permuting threads.
  const int first = min(tid * p.experts_per_thread, num_local);
  const int last = min(first + p.experts_per_thread, num_local);
  auto column = [&](int e, int& below) {
    int count = 0;
    below = 0;
#pragma unroll 4
    for (int c = 0; c < ctas; ++c) {
      const int v = s.table[c * row_bytes + e];
      count += v;
      below += c < rank ? v : 0;
    }
    return count;
  };
  uint64_t mine = 0;
#pragma unroll 1
  for (int e = first; e < last; ++e) {
    int below;
    mine += packed_sums(p, column(e, below));
  }
  uint64_t total = 0;
  uint64_t next = block_exclusive_sum(mine, s.scan64, total, p.owner_warps,
                                      FirstThreads{permute_threads});
  if (rank == 0 && tid == 0) write_layout_totals(p, total);
#pragma unroll 1
  for (int e = first; e < last; ++e) {
    int below;
    const uint64_t sums = packed_sums(p, column(e, below));
    if (rank == 0) write_expert_layout(p, e, sums, next);
    s.base[e] = packed_field(next, 0) + below;
    next += sums;
  }
  FirstThreads{permute_threads}();  // every expert's first row for this CTA
  phase_stamp(s, 6, tid == 0);
  const int rows = (end - begin) * top_k;
#pragma unroll 1
  for (int i = tid; i < rows; i += permute_threads) {
    const int e = s.rows[i];
    const int row = begin * top_k + i;
    if (e < 0) {
      p.expanded_to_permuted[row] = -1;
      continue;
    }
    const int t = exact_quotient(i, p.inv_top_k);
    const int dst = s.base[e] + __popc(s.mask[e] & ((1u << t) - 1u));
    p.permuted_to_expanded[dst] = row;
    p.expanded_to_permuted[row] = dst;
  }
  phase_stamp(s, 7, tid == 0);
  print_stamps(s, "spread", r, rank, ctas);
}

// Precomputed ids, or no tokens: phases 2-4 only.
__global__ void __launch_bounds__(kMaxThreads, 1)
    fused_permute_kernel(const __grid_constant__ BlockPermuteParams p) {
  pdl_begin();
  pdl_launch_dependents();
  __shared__ BlockShared s;
  for (int i = threadIdx.x; i < p.rows; i += blockDim.x)
    s.expert[i] = local_expert(p.topk_ids[i], p);
  __syncthreads();
  permute_block(p, s);
}

// The cluster variant's minimum tokens a routing CTA
// (routing_shape::cluster_routing_ctas: at least this many tokens a CTA and
// at most a warp per token; beyond, the kernel routes on every CTA):
// routing_shape::cluster_min_tokens_by_default, given whether the call
// takes the wide kernels; UNIMOE_CLUSTER_MIN_TOKENS overrides it (for the
// sweep).
int cluster_min_tokens(bool deepseek, int num_experts, bool wide) {
  static const int forced = [] {
    const int v = env_int("UNIMOE_CLUSTER_MIN_TOKENS", INT_MIN);
    return v == INT_MIN ? 0 : std::max(1, v);
  }();
  return forced > 0 ? forced
                    : routing_shape::cluster_min_tokens_by_default(deepseek, num_experts, wide);
}

// The spread kernel's minimum tokens a CTA: as the cluster's (2 for the
// DeepSeek policies, 4 for the others) unless UNIMOE_SPREAD_MIN_TOKENS
// sets it (for the sweep).
int spread_min_tokens(bool deepseek) {
  static const int forced = env_int("UNIMOE_SPREAD_MIN_TOKENS", 0);
  return forced > 0 ? forced : routing_shape::default_spread_min_tokens(deepseek);
}

// The wide choice's kernels (kWide: DeepSeek policies, E = 64..512) are
// instantiated apart: holding its code cost the DeepSeek kernels' other
// paths 2-4% (session 19, run 8 against run 1: T = 16..128, where it never
// ran). The launcher takes them where a CTA of the launch seats its tokens
// (routing_shape::wide_fits, as the kernels decide it per CTA).
template <int kPerLane, bool kDeepSeek>
inline constexpr bool kHasWideKernels = kDeepSeek && kPerLane >= 2 && kPerLane <= 16;

// The largest cluster of the spread kernel the device runs at the kernel's
// largest block: kSpreadMaxCtas (16, non-portable: the H200 runs 14 such
// clusters at once) where it runs one, else the portable 8. Asked once a
// kernel.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold>
int spread_device_max_ctas() {
  static const int largest = [] {
    const auto kernel = spread_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      cudaGetLastError();
      return kClusterMaxCtas;
    }
    if constexpr (kHasWideKernels<kPerLane, kDeepSeek>) {  // its wide twin runs the same clusters
      const auto wide = spread_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
      if (cudaFuncSetAttribute(wide, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
        cudaGetLastError();
        return kClusterMaxCtas;
      }
    }
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = routing_shape::kSpreadMaxCtas;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = routing_shape::kSpreadMaxCtas;
    config.blockDim = fused_threads(kPerLane);
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
      cudaGetLastError();
      clusters = 0;
    }
    return clusters >= 1 ? routing_shape::kSpreadMaxCtas : kClusterMaxCtas;
  }();
  return largest;
}

WideChoice& wide_choice_setting() {
  static WideChoice setting = [] {
    const int v = env_int("UNIMOE_WIDE_CHOICE", -1);
    return v == 0 ? WideChoice::kOff : v == 1 ? WideChoice::kEverywhere : WideChoice::kMeasured;
  }();
  return setting;
}

// The wide choice's parts a token for this call (0: off), as
// wide_choice_setting says.
int wide_parts_for(const RoutingKernelParams& r) {
  const WideChoice setting = wide_choice_setting();
  if (setting == WideChoice::kOff || !is_deepseek(r.policy)) return 0;
  const int parts = routing_shape::wide_parts(r.num_experts, r.n_group, r.experts_per_group);
  return setting == WideChoice::kEverywhere || routing_shape::wide_by_default(parts, r.top_k)
             ? parts
             : 0;
}

ClusterSpread& spread_setting() {
  static ClusterSpread setting{env_switch_on("UNIMOE_CLUSTER_SPREAD"),
                               std::max(0, env_int("UNIMOE_SPREAD_MAX_CTAS", 0)),
                               std::max(0, env_int("UNIMOE_SPREAD_FROM_TOKENS", 0))};
  return setting;
}

// The cluster kernel's largest cluster as set (set_cluster_max_ctas; 0:
// routing_shape::cluster_max_ctas_by_default).
int& cluster_max_ctas_setting() {
  static int setting = [] {
    const int v = env_int("UNIMOE_CLUSTER_MAX_CTAS", 0);
    return v >= 2 ? std::min(v, routing_shape::kClusterMaxCtasNonPortable) : 0;
  }();
  return setting;
}

// Whether the device runs this cluster kernel (and its wide twin) in
// clusters of routing_shape::kClusterMaxCtasNonPortable at its largest
// block: the non-portable size allowed and at least one such cluster
// resident. Asked once a kernel.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold>
bool cluster_runs_large() {
  static const bool runs = [] {
    constexpr int kLarge = routing_shape::kClusterMaxCtasNonPortable;
    const auto allow = [](auto kernel) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
          cudaSuccess)
        return true;
      cudaGetLastError();
      return false;
    };
    const auto kernel = cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>;
    if (!allow(kernel)) return false;
    if constexpr (kHasWideKernels<kPerLane, kDeepSeek>) {
      if (!allow(cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>))
        return false;
    }
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = kLarge;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = kLarge;
    config.blockDim = fused_threads(kPerLane);
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return clusters >= 1;
  }();
  return runs;
}

// The cluster kernel's largest cluster for a call: as set, else the
// measured rule; at most kClusterMaxCtas where the device does not run the
// kernel in larger clusters.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold>
int cluster_max_ctas_for(int num_experts) {
  const int set = cluster_max_ctas_setting();
  const int wanted =
      set > 0 ? set : routing_shape::cluster_max_ctas_by_default(kDeepSeek, num_experts);
  if (wanted <= kClusterMaxCtas) return wanted;
  return cluster_runs_large<LogitT, kPerLane, kDeepSeek, kThreshold>() ? wanted : kClusterMaxCtas;
}

// The single block's decode way (weights_beside_permute, on the host) with
// the wide choice seating its T tokens.
bool block_takes_wide(const RoutingKernelParams& r, const BlockPermuteParams& p, int threads) {
  const int warps = threads / kWarpSize;
  return p.wide_parts > 0 && p.rows <= kWarpSize && r.num_tokens < warps &&
         r.num_tokens * r.num_experts <= kWorkWords &&
         routing_shape::wide_fits(r.num_tokens, p.wide_parts, warps,
                                  routing_shape::kWideMaxTokensBlock);
}

template <typename LogitT, int kPerLane, bool kDeepSeek, bool kThreshold>
void launch_width(const RoutingKernelParams& r, const BlockPermuteParams& p, bool cluster,
                  cudaStream_t stream) {
  // Each launch below takes kernel<..., kThreshold> or, where the wide
  // choice seats its tokens and the wide kernels exist, kernel<..., false,
  // true> (a CTA of it that does not seat its tokens takes the rounds, with
  // the same outputs).
  constexpr bool kHasWide = kHasWideKernels<kPerLane, kDeepSeek>;
  const ClusterSpread spread = spread_setting();
  if (cluster && spread.on) {
    const auto kernel = spread_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>;
    const int device_max = spread_device_max_ctas<LogitT, kPerLane, kDeepSeek, kThreshold>();
    const int max_ctas = spread.max_ctas > 0 ? std::min(spread.max_ctas, device_max) : device_max;
    const routing_shape::SpreadShape shape =
        routing_shape::spread_shape(kPerLane, r.num_tokens, p.num_local, r.num_experts, kDeepSeek,
                                    spread_min_tokens(kDeepSeek), max_ctas);
    // A set threshold (tests, sweeps) replaces the measured defaults.
    const bool take = spread.from_tokens > 0
                          ? shape.ctas > 0 && r.num_tokens >= spread.from_tokens
                          : routing_shape::spread_by_default(shape, r.num_tokens, r.top_k,
                                                             p.num_local, r.num_experts, kDeepSeek);
    if (take) {
      BlockPermuteParams q = for_block(p, shape.permute_threads);
      q.tokens_per_cta = shape.tokens_per_cta;
      const bool wide =
          p.wide_parts > 0 && routing_shape::wide_fits(shape.tokens_per_cta, p.wide_parts,
                                                       shape.threads / kWarpSize,
                                                       routing_shape::kWideMaxTokensCluster);
      auto chosen = kernel;
      if constexpr (kHasWide) {
        if (wide) chosen = spread_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
      }
      launch_pdl_clustered(chosen, shape.ctas, shape.threads, 0, shape.ctas, stream, r, q);
      return;
    }
  }
  const routing_shape::LaunchShape shape = routing_shape::launch_shape(
      kPerLane, r.num_tokens, p.num_local, r.num_experts, kDeepSeek, cluster,
      cluster ? cluster_min_tokens(kDeepSeek, r.num_experts, kHasWide && p.wide_parts > 0) : 1,
      cluster ? cluster_max_ctas_for<LogitT, kPerLane, kDeepSeek, kThreshold>(r.num_experts)
              : kClusterMaxCtas);
  if (shape.routing_ctas == 1) {
    auto kernel = fused_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>;
    if constexpr (kHasWide) {
      if (block_takes_wide(r, p, shape.threads))
        kernel = fused_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
    }
    launch_pdl(kernel, 1, shape.threads, 0, stream, r, for_block(p, shape.threads));
    return;
  }
  // One cluster: CTA 0 permutes, the others route (and CTA 0 too, where
  // the routing CTAs have fewer warps than tokens: shape.overlapped false).
  const int ctas = shape.routing_ctas + 1;
  BlockPermuteParams q = for_block(p, shape.threads);
  q.tokens_per_routing_cta = routing_shape::tokens_per_routing_cta(r.num_tokens, ctas);
  q.tokens_per_cta = routing_shape::tokens_per_cta(r.num_tokens, ctas);
  const bool wide = p.wide_parts > 0 && shape.overlapped &&
                    routing_shape::wide_fits(q.tokens_per_routing_cta, p.wide_parts,
                                             shape.threads / kWarpSize,
                                             routing_shape::kWideMaxTokensCluster);
  auto kernel = cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, kThreshold>;
  if constexpr (kHasWide) {
    if (wide) kernel = cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek, false, true>;
  }
  launch_pdl_clustered(kernel, ctas, shape.threads, 0, ctas, stream, r, q);
}

template <typename LogitT, bool kDeepSeek>
void launch_routing_block(const RoutingKernelParams& r, const BlockPermuteParams& p, bool cluster,
                          cudaStream_t stream) {
  with_slots_per_lane(r.num_experts, [&](auto slots) {
    constexpr int kPerLane = decltype(slots)::value;
    if constexpr (kPerLane >= kThresholdMinSlots) {
      if (routing_shape::threshold_serves(r.top_k, kPerLane, kDeepSeek, r.topk_group,
                                          r.experts_per_group)) {
        launch_width<LogitT, kPerLane, kDeepSeek, true>(r, p, cluster, stream);
        return;
      }
    }
    launch_width<LogitT, kPerLane, kDeepSeek, false>(r, p, cluster, stream);
  });
}

template <typename LogitT>
void launch_for_type(const RoutingKernelParams& r, const BlockPermuteParams& p, bool cluster,
                     cudaStream_t stream) {
  if (is_deepseek(r.policy)) {
    launch_routing_block<LogitT, true>(r, p, cluster, stream);
  } else {
    launch_routing_block<LogitT, false>(r, p, cluster, stream);
  }
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("launch_fused_routing_permute: " + message);
}

}  // namespace

bool fused_routing_fits(int num_tokens, int top_k, int num_local) {
  return num_tokens >= 0 && top_k >= 1 && num_local >= 1 && num_local <= kFusedMaxLocalExperts &&
         static_cast<long long>(num_tokens) * top_k <= kFusedMaxRows;
}

namespace {

void launch_block_or_cluster(const RoutingParams& routing, const PermuteParams& permute,
                             bool cluster, cudaStream_t stream) {
  const bool route = routing.logits != nullptr;
  require(fused_routing_fits(permute.num_tokens, permute.top_k, permute.num_local),
          "needs num_tokens >= 0, top_k >= 1, num_tokens * top_k <= " +
              std::to_string(kFusedMaxRows) + " and num_local 1.." +
              std::to_string(kFusedMaxLocalExperts) + "; got T=" +
              std::to_string(permute.num_tokens) + " K=" + std::to_string(permute.top_k) +
              " num_local=" + std::to_string(permute.num_local));
  require(permute.local_offset >= 0, "local_offset must be >= 0");
  require(permute.num_tile_sizes >= 0 && permute.num_tile_sizes <= kMaxTileSizes,
          "num_tile_sizes must be 0.." + std::to_string(kMaxTileSizes));
  for (int s = 0; s < permute.num_tile_sizes; ++s)
    require(permute.tile_m[s] > 0 && permute.tiles[s] != nullptr && permute.num_tiles[s] != nullptr,
            "each tile size needs tile_m > 0, tiles and num_tiles");
  require(permute.expert_counts != nullptr && permute.expert_offsets != nullptr,
          "expert_counts and expert_offsets must be set");
  const int rows = permute.num_tokens * permute.top_k;
  require(rows == 0 || (permute.permuted_to_expanded != nullptr &&
                        permute.expanded_to_permuted != nullptr),
          "permuted_to_expanded and expanded_to_permuted must be set");
  if (route) {
    check_routing_config(routing, "launch_fused_routing_permute");
    require(routing.num_tokens == permute.num_tokens && routing.config.top_k == permute.top_k,
            "routing and permute disagree on num_tokens or top_k");
    require(permute.topk_ids == nullptr || permute.topk_ids == routing.topk_ids,
            "with logits, permute.topk_ids must be null or routing.topk_ids");
    require(rows == 0 || (routing.topk_ids != nullptr && routing.topk_weights != nullptr),
            "topk_ids and topk_weights must be set");
  } else {
    require(rows == 0 || permute.topk_ids != nullptr,
            "without logits (precomputed ids), permute.topk_ids must be set");
  }

  BlockPermuteParams p{};
  p.topk_ids = route ? nullptr : permute.topk_ids;
  p.rows = rows;
  p.top_k = permute.top_k;
  p.distinct_per_token = route;
  p.local_offset = permute.local_offset;
  p.num_local = permute.num_local;
  p.expert_counts = permute.expert_counts;
  p.expert_offsets = permute.expert_offsets;
  p.permuted_to_expanded = permute.permuted_to_expanded;
  p.expanded_to_permuted = permute.expanded_to_permuted;
  p.num_tile_sizes = permute.num_tile_sizes;
  for (int s = 0; s < permute.num_tile_sizes; ++s) {
    p.tile_m[s] = permute.tile_m[s];
    p.inv_tile_m[s] = inverse_of(permute.tile_m[s]);
    p.tiles[s] = permute.tiles[s];
    p.num_tiles[s] = permute.num_tiles[s];
  }
  p.inv_top_k = inverse_of(permute.top_k);

  if (!route || rows == 0) {
    launch_pdl(fused_permute_kernel, 1, kMaxThreads, 0, stream, for_block(p, kMaxThreads));
  } else {
    const RoutingKernelParams r = make_routing_kernel_params(routing);
    p.wide_parts = static_cast<uint8_t>(wide_parts_for(r));
    p.wide_floor_rank = static_cast<uint8_t>(
        routing_shape::wide_floor_rank(r.top_k, p.wide_parts, r.n_group, r.topk_group));
    if (routing.config.logits_type == LogitsType::BF16) {
      launch_for_type<uint16_t>(r, p, cluster, stream);
    } else {
      launch_for_type<float>(r, p, cluster, stream);
    }
  }
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace

void launch_fused_routing_permute(const RoutingParams& routing, const PermuteParams& permute,
                                  cudaStream_t stream) {
  launch_block_or_cluster(routing, permute, false, stream);
}

void launch_cluster_routing_permute(const RoutingParams& routing, const PermuteParams& permute,
                                    cudaStream_t stream) {
  launch_block_or_cluster(routing, permute, true, stream);
}

ClusterSpread cluster_spread() { return spread_setting(); }

WideChoice wide_choice() { return wide_choice_setting(); }

void set_wide_choice(WideChoice setting) { wide_choice_setting() = setting; }

int cluster_max_ctas() { return cluster_max_ctas_setting(); }

void set_cluster_max_ctas(int max_ctas) {
  if (max_ctas < 0 || max_ctas == 1 || max_ctas > routing_shape::kClusterMaxCtasNonPortable)
    throw std::invalid_argument(
        "set_cluster_max_ctas: max_ctas must be 0 (the measured rule) or 2.." +
        std::to_string(routing_shape::kClusterMaxCtasNonPortable) + "; got " +
        std::to_string(max_ctas));
  cluster_max_ctas_setting() = max_ctas;
}

void set_cluster_spread(ClusterSpread setting) {
  if (setting.from_tokens < 0)
    throw std::invalid_argument("set_cluster_spread: from_tokens must be >= 0; got " +
                                std::to_string(setting.from_tokens));
  if (setting.max_ctas < 0 || setting.max_ctas == 1 || setting.max_ctas > routing_shape::kSpreadMaxCtas)
    throw std::invalid_argument("set_cluster_spread: max_ctas must be 0 (the device's largest) or 2.." +
                                std::to_string(routing_shape::kSpreadMaxCtas) + "; got " +
                                std::to_string(setting.max_ctas));
  spread_setting() = setting;
}

}  // namespace unimoe
