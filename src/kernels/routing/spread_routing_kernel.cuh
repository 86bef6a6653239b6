// The spread cluster kernel (the family: fused_routing.cu; launched where
// routing_shape::spread_by_default says): every CTA of a cluster of up to
// 16 routes its run of tokens and places its own rows, counting each
// expert's rows across the cluster in distributed shared memory.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/routing/fused_routing_kernels.cuh"

namespace unimoe::fused_detail {

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

}  // namespace unimoe::fused_detail
