// The fused routing kernels' parameters and shared memory (the family:
// fused_routing.cu): BlockPermuteParams, the block's shared memory, the
// development phase stamps, and the parameter warm-up every kernel runs
// first. Included by fused_routing.cu only (with the headers that build on
// it: block_permute_piece.cuh, block_permute.cuh, fused_routing_kernels.cuh,
// spread_routing_kernel.cuh).
#pragma once

#include <cstdint>
#include <cstdio>

#include "core/routing_launch_shape.h"
#include "kernels/routing/fused_routing.cuh"
#include "kernels/routing/routing_device.cuh"
#include "kernels/routing/routing_wide.cuh"

namespace unimoe::fused_detail {

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
  // padding byte): a division on the device sat ahead of the first key load.
  uint8_t wide_floor_rank;
  // Whether 33..64 rows take permute_sorted_pair (block_permute.cuh), from
  // the host (the routing plan's sorted pair): the last padding byte.
  bool sorted_pair;
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
inline BlockPermuteParams for_block(BlockPermuteParams p, int threads) {
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
  uint64_t handoff;  // CTA 0 of the overlapped cluster kernel: the staged rows' mbarrier
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
// masks cleared, 1 set, 2 expert sums, 3 scanned (both 0 where
// lay_out_one_size runs), 4 offsets and tiles written, 5 after their
// barrier, 6 rows placed, 7 the last thread placed its rows;
// permute_sorted_pair as permute_sorted_piece.
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

// Reads a word of every 32 bytes of a __grid_constant__ parameter struct and
// returns their XOR. The kernels call it before pdl_begin, where the block
// waits for the previous kernel anyway, and use the result there
// (warm_params), so that the SM's constant cache holds every line of the
// parameters before the critical path reads them: otherwise each field
// misses, one at a time, where the code first needs it (measured on an H200:
// run twice in one launch, the second run of the body was 300-600 cycles
// faster than the first once the parameters were read from the constant bank
// rather than from a local copy made before pdl_begin).
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

// As permute_layout.cuh's local_expert: any int32 id is safe (unsigned
// difference, no overflow); -1 off this rank.
__device__ __forceinline__ int16_t local_expert(int id, const BlockPermuteParams& p) {
  const unsigned e = static_cast<unsigned>(id) - static_cast<unsigned>(p.local_offset);
  return static_cast<int16_t>(e < static_cast<unsigned>(p.num_local) ? static_cast<int>(e) : -1);
}

}  // namespace unimoe::fused_detail
