// The wide choice: the DeepSeek policies' decode selection spread over the
// warps of a block, E / 32 warps (parts) a token and a thread an expert,
// instead of one warp a token (docs/routing.md, "The wide choice"). A warp's
// choice is a chain of dependent instructions (about 3,500 cycles at
// DeepSeekV3 E=256 K=8), and the decode kernels leave most of their warps
// idle while it runs; here each warp takes a short chain over its 32 experts
// and two block barriers join them:
//   1. part w (experts 32w .. 32w + 31, a group where n_group > 1) finds,
//      by rounds of a max-reduce over its lanes' keys, its two best keys
//      (the group score, first + second) and its m-th best, its floor,
//      m = ceil(K / kept parts) (every part kept without groups);
//   2. after the first barrier every part ranks the groups as rank_groups
//      does (larger score, then lower group), keeps the first topk_group,
//      and takes t, the least floor of the kept parts: each kept part holds
//      m keys >= t, so at least K kept keys reach t and the K best are
//      among the candidates, the kept keys >= t. Each kept part appends its
//      candidates to the token's list as (key, expert) pairs
//      (key_expert_pair: larger key, then lower expert, is larger);
//   3. after the second barrier the token's first part ranks the list, 32
//      candidates a pass (one pass unless ties make more than 32): a rank
//      is the count of larger pairs, and rank k < K goes to lane k.
// Pairs are unique, so the ranks below K are exactly the K best in the
// reference's order, bit for bit the warp's choice, whatever the ties: no
// list bound, no fallback. The keys come staged (stage_deepseek_keys); the
// plan (seat, floor rank, area) is made before they are, ahead of the first
// key load, so it holds no division: the floor rank comes from the host and
// the seat from a few compares (a device-side division and reciprocal took
// about 60 instructions there). By default only where it was measured faster
// (fused_routing.cuh, wide_choice; routing_shape::wide_by_default: E <= 256,
// K >= 8). `steps` (development stamps, docs/routing.md "Phase stamps"; null
// otherwise): thread 0 records clock64 after each phase in steps[4..6].
#pragma once

#include <cstdint>

#include "core/routing_launch_shape.h"
#include "kernels/routing/routing_device.cuh"

namespace unimoe::routing_detail {

// Where this warp sits in the wide choice: token `token` of the block's
// run, part `part` (0: the token's first part, which weighs and stages its
// experts afterwards). Warps [first_lead, first_lead + tokens) are the
// tokens' first parts; the others, in order, give each token parts - 1
// more. `seated` false: a spare warp, which only meets the barriers.
struct WideSeat {
  int token;
  int part;
  bool seated;
};

// No division: the helper's token is the count of whole runs of parts - 1
// helpers before it (at most kWideMaxTokensBlock tokens a block), a few
// compares, so that the plan adds no reciprocal or integer division ahead of
// the block's first key load.
__device__ __forceinline__ WideSeat wide_seat(int warp, int first_lead, int tokens, int parts) {
  if (warp >= first_lead && warp < first_lead + tokens) return WideSeat{warp - first_lead, 0, true};
  const int helper = warp < first_lead ? warp : warp - tokens;
  const int helpers = parts - 1;  // a token's
  int token = 0;
#pragma unroll
  for (int t = 1; t < routing_shape::kWideMaxTokensBlock; ++t) token += helper >= t * helpers;
  return WideSeat{token, 1 + helper - token * helpers, helper < tokens * helpers};
}

// The choice's shared memory for `tokens` tokens of `parts` parts, carved
// from the block's work area right after the tokens' staged keys (`keys`,
// 16-byte aligned; pointer arithmetic only, so that the compiler keeps these
// accesses in the shared state space: through an integer cast they become
// generic loads): each token's candidate list (up to E pairs, 16-byte
// aligned: the ranks read two pairs a load), its K slots and list length, and
// each part's group score and floor.
struct WideArea {
  uint64_t* lists;   // [token][E]
  uint64_t* slots;   // [token][kMaxTopK]
  float* scores;     // [token][part]
  uint32_t* floors;  // [token][part]
  int* lengths;      // [token]
};

// Bytes past the keys: lists and slots at most kMaxThreads and
// kWarpSize * kMaxTopK pairs (tokens * E <= the block's threads), scores
// and floors a word a warp, lengths a word a token.
inline constexpr int kWideAreaMaxBytes =
    routing_shape::kMaxThreads * 8 + kWarpSize * kMaxTopK * 8 + 3 * kWarpSize * 4;

__device__ __forceinline__ WideArea wide_area(float* keys, int tokens, int num_experts, int parts) {
  const int cells = tokens * num_experts;  // keys, then as many pairs
  WideArea a;
  a.lists = reinterpret_cast<uint64_t*>(keys + ((cells + 3) & ~3));
  a.slots = a.lists + cells;
  a.scores = reinterpret_cast<float*>(a.slots + tokens * kMaxTopK);
  a.floors = reinterpret_cast<uint32_t*>(a.scores + tokens * parts);
  a.lengths = reinterpret_cast<int*>(a.floors + tokens * parts);
  return a;
}

// What a warp does in the wide choice, fixed before the keys are staged:
// its seat, the token's list, parts and floor rank (m), and the area.
struct WidePlan {
  WideSeat seat;
  int parts;
  int floor_rank;
  WideArea area;
};

// The wide choice of the block's tokens; every thread of the block calls it
// (two __syncthreads). `keys`: the staged rows of E keys of the block's
// run of tokens (row t: the seat's token t); `plan.area`: wide_area of the
// same run. Returns, on lanes k < K of a token's first part, its k-th
// expert and key; elsewhere nothing of use.
__device__ __forceinline__ Chosen choose_wide(const RoutingKernelParams& p, const float* keys,
                                              const WidePlan& plan, int lane,
                                              long long* steps = nullptr) {
  const auto stamp = [&](int i) {
    if (steps != nullptr && threadIdx.x == 0) steps[i] = clock64();
  };
  const WideSeat seat = plan.seat;
  const WideArea& a = plan.area;
  const int num_experts = p.num_experts, parts = plan.parts, m = plan.floor_rank;
  const bool grouped = p.n_group > 1;
  const int rounds_for = grouped ? max(m, 2) : m;
  const int expert = seat.part * kWarpSize + lane;
  const int part_index = seat.token * parts + seat.part;
  uint64_t* list = a.lists + seat.token * num_experts;

  // 1. The part's best keys, a distinct value a round (ties counted); its
  // cells of the token's list cleared, and the list's length.
  uint32_t key = kNoKey;
  if (seat.seated) {
    key = order_key(keys[seat.token * num_experts + expert]);  // never kNoKey
    list[expert] = 0;  // below every pair
    if (seat.part == 0 && lane == 0) a.lengths[seat.token] = 0;
    uint32_t first = kNoKey, second = kNoKey, floor = kNoKey;
    int taken = 0;
    bool open = true;  // not yet taken
    while (taken < rounds_for) {  // uniform per warp
      const uint32_t top = __reduce_max_sync(kFullMask, open ? key : kNoKey);
      const int ties = __popc(__ballot_sync(kFullMask, open && key == top));
      if (taken == 0) first = top;
      if (taken < 2 && taken + ties >= 2) second = top;
      if (taken < m && taken + ties >= m) floor = top;
      taken += ties;
      open = open && key != top;
    }
    if (lane == 0) {
      // The group score as kept_groups forms it (NaN-free: +inf + -inf).
      a.scores[part_index] = nan_to_neg_inf(key_value(first) + key_value(second));
      a.floors[part_index] = floor;
    }
  }
  stamp(4);
  __syncthreads();

  // 2. The kept parts and the threshold; this part's candidates appended
  // to the token's list (in any order: a rank is a count).
  if (seat.seated) {
    uint32_t kept;  // a bit a part
    if (grouped) {
      // Lane g ranks group g: the groups with a larger score, or an equal
      // one and a lower index, come first (rank_groups' order).
      const uint32_t own = lane < parts ? order_key(a.scores[seat.token * parts + lane]) : kNoKey;
      int rank = 0;
#pragma unroll 8
      for (int g = 0; g < parts; ++g) {
        const uint32_t other = __shfl_sync(kFullMask, own, g);
        rank += other > own || (other == own && g < lane);
      }
      kept = __ballot_sync(kFullMask, lane < parts && rank < p.topk_group);
    } else {
      kept = parts == kWarpSize ? kFullMask : (1u << parts) - 1u;
    }
    const uint32_t t = __reduce_min_sync(
        kFullMask, (kept >> lane) & 1u ? a.floors[seat.token * parts + lane] : 0xffffffffu);
    const bool candidate = ((kept >> seat.part) & 1u) != 0u && key >= t;
    const unsigned listed = __ballot_sync(kFullMask, candidate);
    int base = 0;
    if (lane == 0 && listed != 0u) base = atomicAdd(&a.lengths[seat.token], __popc(listed));
    base = __shfl_sync(kFullMask, base, 0);
    if (candidate) list[base + __popc(listed & ((1u << lane) - 1u))] = key_expert_pair(key, expert);
  }
  stamp(5);
  __syncthreads();

  // 3. The token's first part ranks the list, 32 candidates a pass: a rank
  // is the count of larger pairs (the cells past the length hold 0), and
  // rank k < K goes to slot k.
  Chosen chosen{0, kNoKey};
  if (seat.seated && seat.part == 0) {
    const int length = a.lengths[seat.token];
    const ulonglong2* pairs = reinterpret_cast<const ulonglong2*>(list);
    uint64_t* slots = a.slots + seat.token * kMaxTopK;
    for (int first = 0; first < length; first += kWarpSize) {  // uniform per warp
      const uint64_t mine = first + lane < length ? list[first + lane] : 0;
      int rank = 0;
#pragma unroll 4
      for (int i = 0; i < length; i += 2) {
        const ulonglong2 two = pairs[i / 2];
        rank += (two.x > mine) + (two.y > mine);
      }
      if (mine != 0 && rank < p.top_k) slots[rank] = mine;
    }
    __syncwarp();
    if (lane < p.top_k) {
      const uint64_t pair = slots[lane];
      chosen = Chosen{expert_of_pair(pair), static_cast<uint32_t>(pair >> 32)};
    }
  }
  stamp(6);
  return chosen;
}

}  // namespace unimoe::routing_detail
