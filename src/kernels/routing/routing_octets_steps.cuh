// The octet routing kernel's constants and per-token steps (eight lanes a
// token): the keys, exact or filter (with the row staged by cp.async), the
// group stage, the threshold, the candidates and their ranks. Internal to
// routing_octets.cu, which alone includes it (anonymous namespace).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/routing_launch_shape.h"
#include "kernels/common/common.cuh"
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

// Filter keys (approx_score) against the exact ones: a key's two forms differ
// by at most kApproxScoreError in the score plus the roundings of adding the
// bias (half an ulp of the key each: 2^-23 |c| in all), a group score's by
// its two keys' and the rounding of their sum. The margins are twice those
// bounds: the kept groups (where a filter score is within the margins of
// another group's, the warp takes the exact keys) and the candidates (within
// key_margin of the threshold, whose own key has an error too). Wider margins
// cost exact passes: with margins 20 times these bounds, DeepSeekV3 (8
// groups) ran 1.08-1.26x slower than with exact keys alone.
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

// The token's row (16-byte aligned) into its octet's run slots by cp.async:
// piece q of the row (16 bytes) goes to run q / kPieces, and lane `sub`
// copies pieces sub, sub + 8, ..., so that each step of an octet reads 128
// contiguous bytes, all in flight at once. (Each lane reading its own run
// from global memory touched a different 128-byte line a lane, four round
// trips in a row: ncu showed the loads waiting on the load/store queues.)
// Every lane of the warp calls it: the copies (stage_row_copies), then the
// wait (stage_row_wait).
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

}  // namespace
}  // namespace unimoe
