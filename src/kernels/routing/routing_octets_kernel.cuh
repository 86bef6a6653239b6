// The split chain's DeepSeek routing kernel of eight lanes a token
// (routing_octets_kernel), with the permute counts it can write as well
// (count_block_rows). Internal to routing_octets.cu, which alone includes it
// (anonymous namespace; routing_detail's names through the steps header).
//
// The split chain's DeepSeek routing at large T: eight lanes a token (an
// octet), each lane an eighth of the experts, its keys in shared memory
// (docs/routing.md, "Kernel variants and the rule between them"). The rule
// that picks it is routing_shape::split_takes_octets; the outputs are the warp
// kernel's (routing.cu) bit for bit: the same keys, the same group stage,
// the same weights on the same lanes of a segment.
//
// Per token:
//   1. keys: each lane computes its kPerLane keys (deepseek_key) and their
//      two best, first >= second;
//   2. groups (n_group > 1, each group 8 / n_group whole lanes): the group's
//      lanes merge their pairs, and each lane ranks its group among the
//      octet's as rank_groups does; a lane is kept with its group;
//   3. a threshold t: among the kept lanes' `second`, the largest value that
//      ceil(K/2) of them reach. Those lanes each hold two keys >= t, so at
//      least K kept keys reach t and the K best are among the candidates,
//      the kept keys >= t (ties at t included). -inf where no value
//      qualifies: then every kept key is a candidate.
//   4. the candidates (about ten at E=256 K=8 on the sweep's logits, as a
//      host simulation counts them) go to shared memory as (key, ~expert)
//      pairs, the order of the reference
//      (larger key, then lower expert, is larger); each one's rank is the
//      count of larger pairs, and ranks below K name the chosen. More than
//      kListMax candidates (ties, infinities) take K rounds of an octet
//      argmax over the candidates instead.
//   5. weights: lane k < K weighs the k-th expert with chosen_weight, on
//      lanes k of its octet as the warp kernel does on lanes k of its warp;
//   6. (kCount, where the plan's routing_counts_rows) the permute's count kernel's
//      work: each block counts its rows per local expert into a byte table
//      the scan sums (count_block_rows), and the chain drops a launch.
// The keys cost what they cost the warp kernel; the selection costs a few
// hundred thread instructions a token instead of K warp-wide rounds. ncu at
// DeepSeekV3 E=256 K=8 T=16384: 8.65M warp instructions (an earlier build
// 9.32M: 350 a token up to the keys' last store, 181 in the groups, threshold
// and selection, 33 in the weights) against the warp kernel's 19.3M.
//
// The filter mode (routing_shape::octets_filter: the largest T, 16-byte
// aligned logits) takes steps 1-3 with filter keys first:
//   - each token's row is staged into its octet's slots by coalesced
//     cp.async copies (stage_row), and each key is approx_score(x) + bias,
//     within kApproxScoreError of the exact score (checked on the GPU for
//     every float);
//   - the kept groups are taken only where the filter scores decide them
//     beyond group_margin (else the warp redoes steps 1-3 with exact
//     keys), and the candidates are the kept filter keys within
//     key_margin of the threshold: a superset of the exact K best;
//   - the candidates' exact keys (their logits loaded again, spread over
//     the octet) fill the list, so the ranks, ids and weights are the
//     exact mode's.
// Measured with ncu on an H200 (T=16384, kernel alone): DeepSeekV3 E=256 K=8
// 16.2 -> 14.2 us (8.65M -> 6.39M warp instructions), MiniMax2 15.7 -> 12.5.
// Filter keys without the staging ran slower than the exact mode (17.4 us,
// the lanes' own-run loads waiting on the load/store queues).
#pragma once

#include <cstdint>

#include "core/routing_launch_shape.h"
#include "kernels/common/common.cuh"
#include "kernels/routing/routing_device.cuh"
#include "kernels/routing/routing_octets_steps.cuh"

namespace unimoe {
namespace {

// Where the kernels built with kCount count the permute's rows
// (PermuteCounts, for local experts local_offset .. + num_local; `blocks`
// octet blocks a permute chunk).
struct OctetCounts {
  uint64_t* table = nullptr;
  int local_offset = 0;
  int num_local = 0;
  int blocks = 1;
};

// The block's barrier for count_block_rows, which every warp meets at one
// call site, the warps past the tokens too (their routing is skipped by an
// `if`). A form where those warps left through a call site of their own,
// with a barrier without .aligned, measured the same, but compute-sanitizer's
// racecheck and synccheck ran the kernel wrongly in it.
__device__ __forceinline__ void count_barrier() { __syncthreads(); }

// The permute's count kernel's work (routing_shape::octet_count_blocks):
// the block counts its rows per local expert in `area` (the keys' shared
// memory, which no warp reads past the first barrier) and writes them as
// byte j of its chunk's words, j its place in the chunk (the grid is whole
// chunks). No global atomics and nothing to zero beforehand: each byte
// the scan reads is written once a call. `expert`: the lane's chosen
// expert, -1 where the lane chose none. Every thread of the block calls it.
__device__ __forceinline__ void count_block_rows(const OctetCounts& c, int* area, int expert) {
  count_barrier();
  for (int e = threadIdx.x; e < c.num_local; e += kThreads) area[e] = 0;
  count_barrier();
  const int local = expert - c.local_offset;
  if (expert >= 0 && local >= 0 && local < c.num_local) atomicAdd(&area[local], 1);
  count_barrier();
  const int chunk = blockIdx.x / c.blocks, j = blockIdx.x % c.blocks;
  uint8_t* bytes = reinterpret_cast<uint8_t*>(c.table + static_cast<size_t>(chunk) * c.num_local) + j;
  for (int e = threadIdx.x; e < c.num_local; e += kThreads)
    bytes[static_cast<size_t>(e) * sizeof(uint64_t)] = static_cast<uint8_t>(area[e]);
}

// kFilter: the filter mode (octets_filter; 16-byte aligned logits only),
// else exact keys for every expert. kCount: the permute's counts too
// (count_block_rows).
template <typename LogitT, int kPerLane, bool kFilter, bool kCount>
__global__ void __launch_bounds__(kThreads)
    routing_octets_kernel(RoutingKernelParams p, OctetCounts counts) {
  using Mask = SlotMask<kPerLane>;
  // Each lane's keys, and the bias in the same layout; + 4 words a lane
  // puts an octet's 16-byte accesses on different banks.
  __shared__ alignas(16) float s_keys[kTokensPerBlock][kOctetLanes][kPerLane + 4];
  __shared__ alignas(16) float s_bias[kOctetLanes][kPerLane + 4];
  __shared__ alignas(16) uint64_t s_list[kTokensPerBlock][kListMax + 2];
  __shared__ int s_chosen[kTokensPerBlock][kOctetLanes];
  const int lane = threadIdx.x % kWarpSize, sub = lane % kOctetLanes;
  const int slot = threadIdx.x / kOctetLanes;  // the block's token
  const int base = sub * kPerLane;              // the lane's first expert

  // Before the wait: the bias's loads (the bias is no output of the previous
  // grid) and the row's address. Right after it the row's first loads go out
  // (RowStart), and only then is the bias stored and the block's barrier met,
  // so that the bias's latency and the row's overlap (measured on an H200,
  // DeepSeekV3 E=256 K=8 T=16384 20.35 -> 19.80 us; with the address formed
  // after the wait, as the compiler otherwise places it, 20.03). The bias (0
  // where absent) is stored NaN as -inf: then c = s + bias is never NaN, as
  // deepseek_key's c, and needs no test a key.
  constexpr int kBiasPerThread = (kOctetLanes * kPerLane + kThreads - 1) / kThreads;
  float bias_values[kBiasPerThread];
#pragma unroll
  for (int i = 0; i < kBiasPerThread; ++i) {
    const int e = threadIdx.x + i * kThreads;
    bias_values[i] = p.bias != nullptr && e < p.num_experts ? p.bias[e] : 0.0f;
  }
  const int first_token = blockIdx.x * kTokensPerBlock;
  const bool warp_routes = first_token + (threadIdx.x / kWarpSize) * kTokensPerWarp < p.num_tokens;
  const int token = first_token + slot;
  const bool live = token < p.num_tokens;  // the warp's last octets may route a copy of a token
  const LogitT* row = static_cast<const LogitT*>(p.logits) +
                      static_cast<size_t>(live ? token : p.num_tokens - 1) * p.num_experts;
  // A copy formed here, before the wait, for the first loads alone (the
  // other loads keep `row`, which the compiler knows to be global memory).
  const LogitT* row_early = row;
  asm volatile("" : "+l"(row_early));
  pdl_begin();
  RowStart start;
  if (warp_routes) {
    if constexpr (kFilter) {
      stage_row_copies<LogitT, kPerLane>(row_early, &s_keys[slot][0][0], sub);
    } else {
      load_slots<true>(row_early + sub * kPerLane, kChunk, Slots<kChunk, true>{0}, 0.0f, start.chunk);
    }
  }
#pragma unroll
  for (int i = 0; i < kBiasPerThread; ++i) {
    const int e = threadIdx.x + i * kThreads;
    if (e < p.num_experts) s_bias[e / kPerLane][e % kPerLane] = nan_to_neg_inf(bias_values[i]);
  }
  __syncthreads();
  // Whole warps past the tokens skip to the end (with kCount they count
  // nothing there: every thread meets count_block_rows' barriers, at one
  // call site).
  int* count_area = reinterpret_cast<int*>(&s_keys[0][0][0]);
  int counted = -1;  // the expert this thread's row counts (kCount), -1 none
  if (warp_routes) {
    float* keys = s_keys[slot][sub];
    const float* lane_bias = s_bias[sub];

    const auto octet_total = [&](Mask m, int& before) {
      const int mine = popcount(m);
      before = mine;  // inclusive prefix over the octet
  #pragma unroll
      for (int d = 1; d < kOctetLanes; d *= 2) {
        const int v = __shfl_up_sync(kFullMask, before, d, kOctetLanes);
        if (sub >= d) before += v;
      }
      const int total = __shfl_sync(kFullMask, before, kOctetLanes - 1, kOctetLanes);
      before -= mine;
      return total;
    };
    // 1-3: in the filter mode with filter keys first, and the warp again
    // with exact keys where any of its tokens needs them (rare on real
    // logits: near-ties of groups, infinite thresholds, ties of many keys).
    bool exact_needed = true, keys_exact = true;
    Mask candidates = 0;
    int before = 0, total = 0;
    if constexpr (kFilter) {
      candidates = octet_candidates<false, true, true, LogitT, kPerLane>(p, sub, row, lane_bias, keys,
                                                                       start, exact_needed);
      total = octet_total(candidates, before);
      keys_exact = __any_sync(kFullMask, exact_needed || total > kListMax);  // uniform
    }
    if (keys_exact) {
      // In the filter mode the keys have overwritten the staged row: staged
      // again. In the exact mode this is the only pass, its first loads
      // issued above.
      candidates = octet_candidates<true, kFilter, !kFilter, LogitT, kPerLane>(p, sub, row, lane_bias,
                                                                              keys, start, exact_needed);
      total = octet_total(candidates, before);
    }

    // 4. The K best: ranked in shared memory by their exact keys, or K rounds
    // where too many (exact keys only).
    const bool listed = total <= kListMax;
    if (listed) {
      int at = before;
      for (Mask m = candidates; m != 0; m &= m - 1) {
        const int j = lowest_slot(m);
        s_list[slot][at++] = keys_exact ? candidate_pair(keys[j], base + j) : uint64_t(base + j);
      }
    }
    if (listed && !keys_exact) {
      // The candidates' exact keys, spread over the octet (entry i on lane
      // i % 8: at most kListMax / 8 rounded up a lane, their logits all
      // loading first) rather than each lane its own (up to kPerLane, one
      // after another).
      constexpr int kPerSub = (kListMax + kOctetLanes - 1) / kOctetLanes;
      __syncwarp();
      int e[kPerSub];
      float x[kPerSub];
  #pragma unroll
      for (int q = 0; q < kPerSub; ++q) {
        const int i = sub + q * kOctetLanes;
        e[q] = i < total ? static_cast<int>(s_list[slot][i]) : -1;
        x[q] = e[q] >= 0 ? load_logit_ro(row, e[q]) : 0.0f;
      }
  #pragma unroll
      for (int q = 0; q < kPerSub; ++q)
        if (e[q] >= 0)
          s_list[slot][sub + q * kOctetLanes] =
              candidate_pair(deepseek_score(x[q]) + s_bias[e[q] / kPerLane][e[q] % kPerLane], e[q]);
    }
    __syncwarp();
    // A pair's rank is the count of larger pairs in its token's list. In the
    // exact mode, where any token of the warp has more than 8 candidates, a
    // lane ranks its entries sub and sub + 8 in one pass (rank_two_entries);
    // the entries past those, one a pass. (In the filter kernels the one pass
    // made DeepSeekV3 1.02-1.05 slower at K=4 and at T=8192 K=8, even in calls
    // where it did not run, measured on an H200.)
    int first_entry = sub;
    if constexpr (!kFilter) {
      if (__any_sync(kFullMask, listed && sub + kOctetLanes < total)) {  // uniform
        if (listed && sub < total) rank_two_entries(s_list[slot], total, sub, p.top_k, s_chosen[slot]);
        first_entry = sub + 2 * kOctetLanes;
      }
    }
    if (listed) {
      for (int i = first_entry; i < total; i += kOctetLanes) {
        const uint64_t v = s_list[slot][i];
        int rank = 0, q = 0;
        for (; q + 1 < total; q += 2) {  // two pairs a load
          const ulonglong2 two = *reinterpret_cast<const ulonglong2*>(&s_list[slot][q]);
          rank += (two.x > v) + (two.y > v);
        }
        if (q < total) rank += s_list[slot][q] > v;
        if (rank < p.top_k) s_chosen[slot][rank] = expert_of_pair(v);
      }
    }
    const unsigned rounds_lanes = __ballot_sync(kFullMask, !listed);
    if (!listed) {  // whole octets
      Mask left = candidates;
      for (int k = 0; k < p.top_k; ++k) {
        uint64_t best = 0;  // the lane's best left candidate (the lower slot on ties)
        for (Mask m = left; m != 0; m &= m - 1) {
          const int j = lowest_slot(m);
          const uint64_t pair = candidate_pair(keys[j], base + j);
          best = pair > best ? pair : best;
        }
        best = octet_max(best, rounds_lanes);
        const int winner = expert_of_pair(best);
        if (sub == k) s_chosen[slot][k] = winner;
        if (winner / kPerLane == sub) left &= ~(Mask{1} << (winner - base));
      }
    }
    __syncwarp();

    // 5. Weights, lane k of the octet for the k-th expert.
    const bool active = sub < p.top_k;
    const int expert = active ? s_chosen[slot][sub] : 0;
    const float logit = active ? nan_to_neg_inf(load_logit(row, expert)) : 0.0f;
    const float weight =
        static_cast<float>(chosen_weight<true>(p, RowSoftmax{0.0f, 0.0, 0}, logit, active));
    if (live && active) {
      const size_t out = static_cast<size_t>(token) * p.top_k + sub;
      p.topk_ids[out] = expert;
      p.topk_weights[out] = weight;
      counted = expert;
    }
  }
  if constexpr (kCount) count_block_rows(counts, count_area, counted);
}

}  // namespace
}  // namespace unimoe
