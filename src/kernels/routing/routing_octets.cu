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
//   4. the candidates (about ten at E=256 K=8 on the sweep's logits, in a
//      host simulation: docs/notes.md, session 14) go to
//      shared memory as (key, ~expert) pairs, the order of the reference
//      (larger key, then lower expert, is larger); each one's rank is the
//      count of larger pairs, and ranks below K name the chosen. More than
//      kListMax candidates (ties, infinities) take K rounds of an octet
//      argmax over the candidates instead.
//   5. weights: lane k < K weighs the k-th expert with chosen_weight, on
//      lanes k of its octet as the warp kernel does on lanes k of its warp;
//   6. (kCount, where routing_writes_counts) the permute's count kernel's
//      work: each block counts its rows per local expert into a byte table
//      the scan sums (count_block_rows), and the chain drops a launch.
// The keys cost what they cost the warp kernel; the selection costs a few
// hundred thread instructions a token instead of K warp-wide rounds. ncu at
// DeepSeekV3 E=256 K=8 T=16384 (session 14): 8.65M warp instructions (run
// 8; run 4's build 9.32M: 350 a token up to the keys' last store, 181 in
// the groups, threshold and selection, 33 in the weights) against the warp
// kernel's 19.3M (run 1).
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
// Session 15 (ncu, T=16384, kernel alone): DeepSeekV3 E=256 K=8 16.2 ->
// 14.2 us (8.65M -> 6.39M warp instructions), MiniMax2 15.7 -> 12.5. Filter
// keys without the staging ran slower than the exact mode (run 5: 17.4 us,
// the lanes' own-run loads waiting on the load/store queues).
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "core/routing_launch_shape.h"
#include "kernels/common/common.cuh"
#include "kernels/routing/routing.cuh"
#include "kernels/routing/routing_device.cuh"

namespace unimoe {
namespace {

using namespace routing_detail;
using routing_shape::kOctetLanes;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTokensPerWarp = kWarpSize / kOctetLanes;
constexpr int kTokensPerBlock = kWarps * kTokensPerWarp;
static_assert(kTokensPerBlock == routing_shape::kOctetTokensPerBlock,
              "octet_count_blocks cuts chunks into this kernel's blocks");
// Candidates a token ranked in shared memory; with its list's row of
// kListMax + 2 pairs (16-byte aligned, and the octets' rows on other banks),
// nine blocks fit an SM at E = 256.
constexpr int kListMax = 28;
constexpr int kChunk = 8;  // keys a lane computes between stores
static_assert(kOctetLanes == 8, "octet shuffles below are three butterfly levels");

// A candidate's (key, expert) pair: the larger is better, ties to the lower
// expert.
__device__ __forceinline__ uint64_t candidate_pair(float c, int expert) {
  return key_expert_pair(order_key(c), expert);
}

__device__ __forceinline__ uint64_t octet_max(uint64_t v, unsigned mask) {
#pragma unroll
  for (int d = kOctetLanes / 2; d > 0; d /= 2) {
    const uint64_t other = __shfl_xor_sync(mask, v, d, kOctetLanes);
    v = other > v ? other : v;
  }
  return v;
}

// Filter keys (approx_score) against the exact ones: a key's two forms
// differ by at most kApproxScoreError in the score plus the roundings of
// adding the bias (half an ulp of the key each: 2^-23 |c| in all), a group
// score's by its two keys' and the rounding of their sum. The margins are
// twice those bounds: the kept groups (where a filter score is within the
// margins of another group's, the warp takes the exact keys) and the
// candidates (within key_margin of the threshold, whose own key has an
// error too). Wider margins cost exact passes: session 15 run 4, with
// margins 20 times these bounds, DeepSeekV3 (8 groups) ran 1.08-1.26x
// slower than with exact keys alone.
__device__ __forceinline__ float group_margin(float first, float second) {
  return 4.0f * kApproxScoreError + 0x1p-21f * (fabsf(first) + fabsf(second));
}
__device__ __forceinline__ float key_margin(float t) {
  return 4.0f * kApproxScoreError + 0x1p-21f * fabsf(t);
}

// Step 2: whether this lane's group is kept (every lane calls it). With
// filter keys (!kExact), `certain` says whether the exact keys keep the same
// groups: each other group's score is surely above this one's (beyond both
// margins) or surely not, wherever that decides this group. An octet with
// a score that is not finite (infinite biases, or two keys' sum past the
// largest float), or whose margin overflows, is never certain: the warp
// takes the exact keys. kGroups > 0: n_group is kGroups (the common
// DeepSeekV3 case, a group a lane, compiled with its shuffles' lanes and
// bounds known); 0: p.n_group.
template <bool kExact, int kGroups>
__device__ __forceinline__ bool octet_group_kept(const RoutingKernelParams& p, int sub, float first,
                                                 float second, bool& certain) {
  static_assert(kGroups == 0 || kGroups == kOctetLanes, "a compiled group count is a group a lane");
  certain = true;
  const int n_group = kGroups > 0 ? kGroups : p.n_group;
  if (n_group == 1) return true;
  const int lanes_log2 = kGroups > 0 ? 0 : 3 - (__ffs(n_group) - 1);  // lanes a group: 8 / n_group
  for (int d = (1 << lanes_log2) / 2; d > 0; d /= 2) {
    const float other_first = __shfl_xor_sync(kFullMask, first, d, kOctetLanes);
    const float other_second = __shfl_xor_sync(kFullMask, second, d, kOctetLanes);
    second = fmaxf(fminf(first, other_first), fmaxf(second, other_second));
    first = fmaxf(first, other_first);
  }
  // The group score, NaN-free (+inf + -inf); floats compare as order_key
  // does (-0 == +0), ties to the lower group.
  const float score = nan_to_neg_inf(first + second);
  // Two groups' margins, bounded by twice the octet's largest; +inf where
  // any score is not finite.
  float margin = 0.0f;
  if constexpr (!kExact) {
    margin = isfinite(score) ? group_margin(first, second) : INFINITY;
#pragma unroll
    for (int d = kOctetLanes / 2; d > 0; d /= 2)
      margin = fmaxf(margin, __shfl_xor_sync(kFullMask, margin, d, kOctetLanes));
    margin *= 2.0f;
  }
  const int group = sub >> lanes_log2;
  int rank = 0, surely_above = 0, maybe_above = 0;
#pragma unroll
  for (int g = 0; g < kOctetLanes; ++g) {
    const float other = __shfl_sync(kFullMask, score, (g << lanes_log2) & 7, kOctetLanes);
    const bool above = other > score || (other == score && g < group);
    if (g < n_group) rank += above;
    if constexpr (!kExact) {
      if (g < n_group) {  // this group's own term: 0 and 1 where the margin is finite
        surely_above += other > score + margin;
        maybe_above += other >= score - margin;
      }
    }
  }
  if constexpr (!kExact) {
    maybe_above -= 1;
    certain = margin < INFINITY && (maybe_above < p.topk_group || surely_above >= p.topk_group);
  }
  return rank < p.topk_group;
}

// Step 3: the threshold (every lane calls it).
__device__ __forceinline__ float octet_threshold(int top_k, bool kept, float second) {
  const float mine = kept ? second : -INFINITY;
  int reach = 0;
#pragma unroll
  for (int l = 0; l < kOctetLanes; ++l) reach += __shfl_sync(kFullMask, mine, l, kOctetLanes) >= mine;
  float t = reach >= (top_k + 1) / 2 ? mine : -INFINITY;
#pragma unroll
  for (int d = kOctetLanes / 2; d > 0; d /= 2) t = fmaxf(t, __shfl_xor_sync(kFullMask, t, d, kOctetLanes));
  return t;
}

// A lane's keys and candidates: a bit a slot.
template <int kPerLane>
using SlotMask = std::conditional_t<(kPerLane > 32), uint64_t, uint32_t>;

template <bool kExact>
__device__ __forceinline__ float key_score(float x) {
  return kExact ? deepseek_score(x) : approx_score(x);
}

// Where an octet's runs lie in its token's row of s_keys: a slot of
// kPerLane + 4 words a lane, the run's logits staged at its end
// (kStageBytes in), its keys written from the start over them (key j's
// store never reaches a logit not yet read: j's 4 bytes end before logit
// j + 4 begins, for fp32 and bf16 alike).
template <typename LogitT, int kPerLane>
struct RunSlots {
  static constexpr int kSlotBytes = (kPerLane + 4) * 4;
  static constexpr int kRunBytes = kPerLane * static_cast<int>(sizeof(LogitT));
  static constexpr int kPieces = kRunBytes / 16;  // 16-byte pieces a run
  static constexpr int kStageBytes = kSlotBytes - kRunBytes;
  static_assert(kRunBytes % 16 == 0 && kStageBytes % 16 == 0, "runs of whole 16-byte pieces");
};

__device__ __forceinline__ void cp_async_16(void* smem, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "l"(global)
               : "memory");
}

// The token's row (16-byte aligned) into its octet's run slots by
// cp.async: piece q of the row (16 bytes) goes to run q / kPieces, and lane
// `sub` copies pieces sub, sub + 8, ..., so that each step of an octet
// reads 128 contiguous bytes, all in flight at once. (Each lane reading its
// own run from global memory touched a different 128-byte line a lane,
// four round trips in a row: session 15 run 6, ncu, the loads waited on
// the load/store queues.) Every lane of the warp calls it: the copies
// (stage_row_copies), then the wait (stage_row_wait).
template <typename LogitT, int kPerLane>
__device__ __forceinline__ void stage_row_copies(const LogitT* row, float* token_slots, int sub) {
  using S = RunSlots<LogitT, kPerLane>;
  const char* src = reinterpret_cast<const char*>(row);
  char* dst = reinterpret_cast<char*>(token_slots);
#pragma unroll
  for (int i = 0; i < S::kPieces; ++i) {
    const int q = i * kOctetLanes + sub;
    cp_async_16(dst + (q / S::kPieces) * S::kSlotBytes + S::kStageBytes + (q % S::kPieces) * 16,
                src + q * 16);
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void stage_row_wait() {
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncwarp();  // the octet's pieces, copied by its other lanes
}

// The row's first loads, which the kernel issues right after its wait
// (routing_octets_kernel): in the filter mode the staging copies (in
// flight, nothing held here), else the lane's first kChunk logits.
struct RowStart {
  float chunk[kChunk];
};

// Four staged logits of the lane's run from `staged` (its slot's run).
__device__ __forceinline__ void staged_four(const float* staged, int v, float (&x)[4]) {
  const float4 f = *reinterpret_cast<const float4*>(staged + v);
  x[0] = f.x, x[1] = f.y, x[2] = f.z, x[3] = f.w;
}
__device__ __forceinline__ void staged_four(const uint16_t* staged, int v, float (&x)[4]) {
  const uint2 u = *reinterpret_cast<const uint2*>(staged + v);
  x[0] = __uint_as_float(u.x << 16), x[1] = __uint_as_float(u.x & 0xffff0000u);
  x[2] = __uint_as_float(u.y << 16), x[3] = __uint_as_float(u.y & 0xffff0000u);
}

// The keys of four logits into keys[v..v+3], and the lane's two best.
template <bool kExact>
__device__ __forceinline__ void four_keys(const float (&x)[4], const float* bias, float* keys, int v,
                                          float& first, float& second) {
  const float4 b = *reinterpret_cast<const float4*>(bias + v);
  const float c[4] = {key_score<kExact>(x[0]) + b.x, key_score<kExact>(x[1]) + b.y,
                      key_score<kExact>(x[2]) + b.z, key_score<kExact>(x[3]) + b.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    second = fmaxf(second, fminf(first, c[i]));
    first = fmaxf(first, c[i]);
  }
  *reinterpret_cast<float4*>(keys + v) = make_float4(c[0], c[1], c[2], c[3]);
}

// Step 1: the lane's keys into shared memory (its slot), and its two best.
// kExact: deepseek_key's c (sigmoid_fp32 takes NaN as -inf); else filter
// keys. kStaged (the filter mode; 16-byte aligned logits): the token's row
// is staged first (stage_row_copies); otherwise each lane loads its own
// run, kChunk logits at a time, the next chunk loading meanwhile (a chunk
// never reaches past E = 8 * kPerLane: the bound given to load_slots is
// the chunk's own length). kStarted: the kernel issued the row's first
// loads (`start`); else they are issued here.
template <bool kExact, bool kStaged, bool kStarted, typename LogitT, int kPerLane>
__device__ __forceinline__ void octet_keys(const LogitT* row, int sub, const float* bias, float* keys,
                                           const RowStart& start, float& first, float& second) {
  first = -INFINITY;
  second = -INFINITY;
  if constexpr (kStaged) {
    using S = RunSlots<LogitT, kPerLane>;
    if constexpr (!kStarted) stage_row_copies<LogitT, kPerLane>(row, keys - sub * (kPerLane + 4), sub);
    stage_row_wait();
    const LogitT* staged =
        reinterpret_cast<const LogitT*>(reinterpret_cast<const char*>(keys) + S::kStageBytes);
#pragma unroll
    for (int v = 0; v < kPerLane; v += 4) {
      float x[4];
      staged_four(staged, v, x);
      four_keys<kExact>(x, bias, keys, v, first, second);
    }
  } else {
    const LogitT* lane_row = row + sub * kPerLane;
    float x[kChunk];
    if constexpr (kStarted) {
#pragma unroll
      for (int j = 0; j < kChunk; ++j) x[j] = start.chunk[j];
    } else {
      load_slots<true>(lane_row, kChunk, Slots<kChunk, true>{0}, 0.0f, x);
    }
#pragma unroll
    for (int v = 0; v < kPerLane; v += kChunk) {
      float next[kChunk];
      if (v + kChunk < kPerLane)
        load_slots<true>(lane_row + v + kChunk, kChunk, Slots<kChunk, true>{0}, 0.0f, next);
#pragma unroll
      for (int j = 0; j < kChunk; j += 4) {
        const float four[4] = {x[j], x[j + 1], x[j + 2], x[j + 3]};
        four_keys<kExact>(four, bias, keys, v + j, first, second);
      }
      if (v + kChunk < kPerLane) {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) x[j] = next[j];
      }
    }
  }
}

// Steps 1-3 with one kind of key: the lane's candidates (a bit a slot),
// and whether the exact keys are needed (filter keys only: a kept group
// the exact keys might not keep, a threshold at +inf, or more candidates
// than the list holds).
template <bool kExact, bool kStaged, bool kStarted, typename LogitT, int kPerLane>
__device__ __forceinline__ SlotMask<kPerLane> octet_candidates(const RoutingKernelParams& p, int sub,
                                                               const LogitT* row, const float* bias,
                                                               float* keys, const RowStart& start,
                                                               bool& exact_needed) {
  using Mask = SlotMask<kPerLane>;
  float first, second;
  octet_keys<kExact, kStaged, kStarted, LogitT, kPerLane>(row, sub, bias, keys, start, first, second);
  // 2-3. Kept groups, the threshold, the candidates (a lane reads back only
  // its own keys: no barrier). Filter keys take every key within
  // key_margin of the threshold: at least K kept keys reach t, so the K-th
  // best exact key is at least t less one key's error, and each exact one
  // of the K best has a filter key at least t less two.
  bool certain;
  const bool kept = p.n_group == kOctetLanes
                        ? octet_group_kept<kExact, kOctetLanes>(p, sub, first, second, certain)
                        : octet_group_kept<kExact, 0>(p, sub, first, second, certain);
  const float t = octet_threshold(p.top_k, kept, second);
  const float floor = kExact ? t : t - key_margin(t);  // -inf stays -inf
  Mask candidates = 0;
  if (kept) {
#pragma unroll
    for (int j = 0; j < kPerLane; j += 4) {
      const float4 c = *reinterpret_cast<const float4*>(keys + j);
      candidates |= static_cast<Mask>((c.x >= floor) | (c.y >= floor) << 1 | (c.z >= floor) << 2 |
                                      (c.w >= floor) << 3)
                    << j;
    }
  }
  exact_needed = !kExact && (!certain || t == INFINITY);
  return candidates;
}

__device__ __forceinline__ int popcount(uint32_t m) { return __popc(m); }
__device__ __forceinline__ int popcount(uint64_t m) { return __popcll(m); }
__device__ __forceinline__ int lowest_slot(uint32_t m) { return __ffs(static_cast<int>(m)) - 1; }
__device__ __forceinline__ int lowest_slot(uint64_t m) {
  return __ffsll(static_cast<long long>(m)) - 1;
}

// Entries sub and sub + 8 (where there is one) of a token's list of
// `total` candidate pairs ranked in one pass over the list: a pair's rank is
// the count of larger pairs, and ranks below K name the chosen.
__device__ __forceinline__ void rank_two_entries(const uint64_t* list, int total, int sub, int top_k,
                                                 int* chosen) {
  const bool has_second = sub + kOctetLanes < total;
  const uint64_t v0 = list[sub];
  const uint64_t v1 = has_second ? list[sub + kOctetLanes] : ~uint64_t(0);
  int rank0 = 0, rank1 = 0, q = 0;
  for (; q + 1 < total; q += 2) {  // two pairs a load
    const ulonglong2 two = *reinterpret_cast<const ulonglong2*>(&list[q]);
    rank0 += (two.x > v0) + (two.y > v0);
    rank1 += (two.x > v1) + (two.y > v1);
  }
  if (q < total) {
    const uint64_t last = list[q];
    rank0 += last > v0;
    rank1 += last > v1;
  }
  if (rank0 < top_k) chosen[rank0] = expert_of_pair(v0);
  if (has_second && rank1 < top_k) chosen[rank1] = expert_of_pair(v1);
}

// Where the kernels built with kCount count the permute's rows
// (PermuteCounts, for local experts local_offset .. + num_local; `blocks`
// octet blocks a permute chunk).
struct OctetCounts {
  uint64_t* table = nullptr;
  int local_offset = 0;
  int num_local = 0;
  int blocks = 1;
};

// The block's barrier for count_block_rows, which warps past the tokens
// reach from their own call site (they leave early, as without kCount):
// barrier.sync without .aligned (which __syncthreads is) allows that.
// (Run 3's form, the routing inside an `if` so that every warp met the
// same __syncthreads, measured the same; session 18 runs 3-4.)
__device__ __forceinline__ void count_barrier() {
  asm volatile("barrier.sync 1, %0;" ::"n"(kThreads) : "memory");
}

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

  // Before the wait: the bias's loads (the bias is no output of the
  // previous grid) and the row's address. Right after it the row's first
  // loads go out (RowStart), and only then is the bias stored and the
  // block's barrier met, so that the bias's latency and the row's overlap
  // (session 24 run 3, DeepSeekV3 E=256 K=8 T=16384 20.35 -> 19.80 us; with
  // the address formed after the wait, as the compiler otherwise places
  // it, 20.03). The bias (0 where absent) is stored NaN as -inf: then
  // c = s + bias is never NaN, as deepseek_key's c, and needs no test a key.
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
  // Whole warps past the tokens leave (with kCount after counting nothing:
  // every thread meets count_block_rows' barriers).
  int* count_area = reinterpret_cast<int*>(&s_keys[0][0][0]);
  if (!warp_routes) {
    if constexpr (kCount) count_block_rows(counts, count_area, -1);
    return;
  }
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
  // made DeepSeekV3 1.02-1.05 slower at K=4 and at T=8192 K=8, even in
  // calls where it did not run: session 24 runs 6-7.)
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
  }
  if constexpr (kCount) count_block_rows(counts, count_area, live && active ? expert : -1);
}

template <typename LogitT, bool kFilter, bool kCount>
void launch_mode(const RoutingKernelParams& p, const OctetCounts& counts, int blocks,
                 KernelStream stream) {
  const auto launch = [&](auto kernel) {
    launch_pdl(kernel, blocks, kThreads, 0, stream, p, counts);
  };
  switch (p.num_experts / kOctetLanes) {
    case 8: launch(routing_octets_kernel<LogitT, 8, kFilter, kCount>); break;
    case 16: launch(routing_octets_kernel<LogitT, 16, kFilter, kCount>); break;
    case 32: launch(routing_octets_kernel<LogitT, 32, kFilter, kCount>); break;
    default: launch(routing_octets_kernel<LogitT, 48, kFilter, kCount>); break;
  }
}

// With `counts`: the grid rounded up to whole permute chunks
// (octet_count_blocks blocks each; blocks past the tokens count zeros).
template <typename LogitT, bool kCount>
void launch_for_slots(const RoutingKernelParams& p, bool filter, const PermuteCounts* counts,
                      KernelStream stream) {
  OctetCounts c;
  if constexpr (kCount) {
    c = OctetCounts{counts->table, counts->local_offset, counts->num_local,
                    routing_shape::octet_count_blocks(p.top_k, counts->chunk_rows)};
    if (c.blocks < 1 || counts->table == nullptr)
      throw std::invalid_argument("launch_routing: these permute counts are not the octet kernel's");
  }
  const int blocks = ceil_div(ceil_div(p.num_tokens, kTokensPerBlock), c.blocks) * c.blocks;
  if constexpr (kCount) {
    if (blocks / c.blocks != counts->num_chunks)
      throw std::invalid_argument("launch_routing: the permute chunks are not whole octet blocks");
  }
  if (filter) {
    launch_mode<LogitT, true, kCount>(p, c, blocks, stream);
  } else {
    launch_mode<LogitT, false, kCount>(p, c, blocks, stream);
  }
  UNIMOE_LAUNCH_CHECK();
}

template <typename LogitT>
void launch_for_counts(const RoutingKernelParams& p, bool filter, const PermuteCounts* counts,
                       KernelStream stream) {
  if (counts != nullptr) {
    launch_for_slots<LogitT, true>(p, filter, counts, stream);
  } else {
    launch_for_slots<LogitT, false>(p, filter, counts, stream);
  }
}

}  // namespace

void launch_routing_octets(const RoutingKernelParams& p, bool bf16_logits, bool filter,
                           const PermuteCounts* counts, KernelStream stream) {
  if (bf16_logits) {
    launch_for_counts<uint16_t>(p, filter, counts, stream);
  } else {
    launch_for_counts<float>(p, filter, counts, stream);
  }
}

}  // namespace unimoe
