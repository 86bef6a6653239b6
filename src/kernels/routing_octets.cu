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
//      lanes k of its octet as the warp kernel does on lanes k of its warp.
// The keys cost what they cost the warp kernel; the selection costs a few
// hundred thread instructions a token instead of K warp-wide rounds. ncu at
// DeepSeekV3 E=256 K=8 T=16384 (session 14): 8.65M warp instructions (run
// 8; run 4's build 9.32M: 350 a token up to the keys' last store, 181 in
// the groups, threshold and selection, 33 in the weights) against the warp
// kernel's 19.3M (run 1).
#include <cstdint>
#include <type_traits>

#include "core/routing_launch_shape.h"
#include "kernels/common.cuh"
#include "kernels/routing.cuh"
#include "kernels/routing_device.cuh"

namespace unimoe {
namespace {

using namespace routing_detail;
using routing_shape::kOctetLanes;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTokensPerWarp = kWarpSize / kOctetLanes;
constexpr int kTokensPerBlock = kWarps * kTokensPerWarp;
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

// Step 2: whether this lane's group is kept (every lane calls it).
__device__ __forceinline__ bool octet_group_kept(const RoutingKernelParams& p, int sub, float first,
                                                 float second) {
  if (p.n_group == 1) return true;
  const int lanes_log2 = 3 - (__ffs(p.n_group) - 1);  // lanes a group: 8 / n_group
  for (int d = (1 << lanes_log2) / 2; d > 0; d /= 2) {
    const float other_first = __shfl_xor_sync(kFullMask, first, d, kOctetLanes);
    const float other_second = __shfl_xor_sync(kFullMask, second, d, kOctetLanes);
    second = fmaxf(fminf(first, other_first), fmaxf(second, other_second));
    first = fmaxf(first, other_first);
  }
  const uint32_t group_key = order_key(nan_to_neg_inf(first + second));  // +inf + -inf
  const int group = sub >> lanes_log2;
  int rank = 0;
#pragma unroll
  for (int g = 0; g < kOctetLanes; ++g) {
    const uint32_t other = __shfl_sync(kFullMask, group_key, (g << lanes_log2) & 7, kOctetLanes);
    if (g < p.n_group) rank += other > group_key || (other == group_key && g < group);
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

template <typename LogitT, int kPerLane>
__global__ void __launch_bounds__(kThreads) routing_octets_kernel(RoutingKernelParams p) {
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

  // The bias (0 where absent), NaN as -inf: then c = s + bias is never NaN,
  // as deepseek_key's c, and needs no test a key. Written before the wait:
  // the bias is no output of the previous grid.
  for (int e = threadIdx.x; e < p.num_experts; e += kThreads)
    s_bias[e / kPerLane][e % kPerLane] = p.bias != nullptr ? nan_to_neg_inf(p.bias[e]) : 0.0f;
  pdl_begin();
  __syncthreads();
  const int first_token = blockIdx.x * kTokensPerBlock;
  if (first_token + (threadIdx.x / kWarpSize) * kTokensPerWarp >= p.num_tokens) return;  // whole warp
  const int token = first_token + slot;
  const bool live = token < p.num_tokens;  // the warp's last octets may route a copy of a token
  const LogitT* row = static_cast<const LogitT*>(p.logits) +
                      static_cast<size_t>(live ? token : p.num_tokens - 1) * p.num_experts;

  // 1. Keys, into shared memory, and this lane's two best, kChunk at a time
  // (few keys live in registers: the registers decide how many warps hide
  // each key's chain), the next chunk's logits loading meanwhile. A chunk
  // of a lane's run never reaches past E (E = 8 * kPerLane): the bound
  // given to load_slots is the chunk's own length.
  float* keys = s_keys[slot][sub];
  const float* bias = s_bias[sub];
  float first = -INFINITY, second = -INFINITY;
  float x[kChunk];  // logits
  load_slots<true>(row + base, kChunk, Slots<kChunk, true>{0}, 0.0f, x);
#pragma unroll
  for (int v = 0; v < kPerLane; v += kChunk) {
    float next[kChunk];
    if (v + kChunk < kPerLane)
      load_slots<true>(row + base + v + kChunk, kChunk, Slots<kChunk, true>{0}, 0.0f, next);
#pragma unroll
    for (int j = 0; j < kChunk; j += 4) {
      const float4 b = *reinterpret_cast<const float4*>(bias + v + j);
      // deepseek_key's c (sigmoid_fp32 takes NaN as -inf).
      const float c[4] = {deepseek_score(x[j]) + b.x, deepseek_score(x[j + 1]) + b.y,
                          deepseek_score(x[j + 2]) + b.z, deepseek_score(x[j + 3]) + b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        second = fmaxf(second, fminf(first, c[i]));
        first = fmaxf(first, c[i]);
      }
      *reinterpret_cast<float4*>(keys + v + j) = make_float4(c[0], c[1], c[2], c[3]);
    }
    if (v + kChunk < kPerLane) {
#pragma unroll
      for (int j = 0; j < kChunk; ++j) x[j] = next[j];
    }
  }

  // 2-3. Kept groups, the threshold, the candidates as a bit a slot (a lane
  // reads back only its own keys: no barrier).
  const bool kept = octet_group_kept(p, sub, first, second);
  const float t = octet_threshold(p.top_k, kept, second);
  Mask candidates = 0;
  if (kept) {
#pragma unroll
    for (int j = 0; j < kPerLane; j += 4) {
      const float4 c = *reinterpret_cast<const float4*>(keys + j);
      candidates |= static_cast<Mask>((c.x >= t) | (c.y >= t) << 1 | (c.z >= t) << 2 | (c.w >= t) << 3)
                    << j;
    }
  }
  const int mine = kPerLane > 32 ? __popcll(candidates) : __popc(static_cast<uint32_t>(candidates));
  int before = mine;  // inclusive prefix over the octet
#pragma unroll
  for (int d = 1; d < kOctetLanes; d *= 2) {
    const int v = __shfl_up_sync(kFullMask, before, d, kOctetLanes);
    if (sub >= d) before += v;
  }
  const int total = __shfl_sync(kFullMask, before, kOctetLanes - 1, kOctetLanes);
  before -= mine;

  // 4. The K best: ranked in shared memory, or K rounds where too many.
  const bool listed = total <= kListMax;
  if (listed) {
    int at = before;
    for (Mask m = candidates; m != 0; m &= m - 1) {
      const int j = kPerLane > 32 ? __ffsll(static_cast<long long>(m)) - 1
                                  : __ffs(static_cast<int>(m)) - 1;
      s_list[slot][at++] = candidate_pair(keys[j], base + j);
    }
  }
  __syncwarp();
  if (listed) {
    for (int i = sub; i < total; i += kOctetLanes) {
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
        const int j = kPerLane > 32 ? __ffsll(static_cast<long long>(m)) - 1
                                    : __ffs(static_cast<int>(m)) - 1;
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
}

template <typename LogitT>
void launch_for_slots(const RoutingKernelParams& p, cudaStream_t stream) {
  const int blocks = ceil_div(p.num_tokens, kTokensPerBlock);
  switch (p.num_experts / kOctetLanes) {
    case 8: launch_pdl(routing_octets_kernel<LogitT, 8>, blocks, kThreads, 0, stream, p); break;
    case 16: launch_pdl(routing_octets_kernel<LogitT, 16>, blocks, kThreads, 0, stream, p); break;
    case 32: launch_pdl(routing_octets_kernel<LogitT, 32>, blocks, kThreads, 0, stream, p); break;
    default: launch_pdl(routing_octets_kernel<LogitT, 48>, blocks, kThreads, 0, stream, p); break;
  }
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace

void launch_routing_octets(const RoutingKernelParams& p, bool bf16_logits, cudaStream_t stream) {
  if (bf16_logits) {
    launch_for_slots<uint16_t>(p, stream);
  } else {
    launch_for_slots<float>(p, stream);
  }
}

}  // namespace unimoe
