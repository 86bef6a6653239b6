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
// rows (decode), phases 2-4 take a short path without barriers
// (permute_one_piece). The routing kernels let the next kernel launch at
// once (pdl_launch_dependents): its CTAs wait for this one's end on the
// otherwise idle SMs.
//
// The cluster variant spreads phase 1 over a thread-block cluster: warp w
// of CTA c routes tokens c * warps + w, + ctas * warps, ..., and stages each
// row's expert straight into CTA 0's shared memory (distributed shared
// memory); after a cluster barrier CTA 0 alone runs phases 2-4, unchanged.
#include <cooperative_groups.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/common.cuh"
#include "kernels/fused_routing.cuh"
#include "kernels/routing_device.cuh"

namespace unimoe {
namespace {

using namespace routing_detail;

constexpr int kWorkWords = 8192;
constexpr int kMaxThreads = 1024;

// Threads of the routing kernel for kPerLane experts a lane: every warp gets
// kPerLane * 32 group keys in the work area. This also bounds registers:
// kPerLane = 32 needs about 150 a thread, which 256 threads allow.
constexpr int fused_threads(int per_lane) {
  return kWorkWords / per_lane < kMaxThreads ? kWorkWords / per_lane : kMaxThreads;
}

static_assert(fused_threads(kMaxExperts / kWarpSize) % kWarpSize == 0 &&
                  fused_threads(kMaxExperts / kWarpSize) * (kMaxExperts / kWarpSize) <= kWorkWords,
              "whole warps, whose group keys fit in the work area");
static_assert(kWorkWords / kFusedMaxLocalExperts >= 1, "at least one scatter warp");
static_assert(kWorkWords / kMaxExperts >= 1, "the DeepSeek keys of at least one token fit");
static_assert(kWorkWords >= kMaxTileSizes * (kFusedMaxLocalExperts + 1),
              "every schedule's tile bases fit in the work area");
static_assert(kFusedMaxLocalExperts <= 32767, "staged experts are int16");
static_assert(kMaxThreads / kWarpSize <= kWarpSize, "one warp scans the warp totals");

struct BlockPermuteParams {
  const int32_t* topk_ids;  // [rows], precomputed mode only
  int rows;                 // T * K
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
};

struct BlockShared {
  union {
    float keys[kWorkWords];     // phase 1: each warp's group keys
    int32_t words[kWorkWords];  // phases 2-4: cursors [scatter warps][E_local], then tile bases
  } work;
  int16_t expert[kFusedMaxRows];               // local expert of each expanded row, -1 off rank
  int32_t offsets[kFusedMaxLocalExperts + 1];  // expert offsets
  int32_t scan[kWarpSize + 1];                 // block scan: warp bases, then the total
};

static_assert(sizeof(BlockShared) <= 48 * 1024, "fits static shared memory");

__device__ __forceinline__ int16_t local_expert(int id, const BlockPermuteParams& p) {
  const int e = id - p.local_offset;
  return static_cast<int16_t>(e >= 0 && e < p.num_local ? e : -1);
}

// Exclusive sum of one value per thread over the block; `total` gets the sum
// of all. Every thread calls it.
__device__ int block_exclusive_sum(int value, int* s_scan, int& total) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  int inclusive = value;
#pragma unroll
  for (int d = 1; d < kWarpSize; d *= 2) {
    const int other = __shfl_up_sync(kFullMask, inclusive, d);
    if (lane >= d) inclusive += other;
  }
  if (lane == kWarpSize - 1) s_scan[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int w = lane < warps ? s_scan[lane] : 0;
    int w_inclusive = w;
#pragma unroll
    for (int d = 1; d < kWarpSize; d *= 2) {
      const int other = __shfl_up_sync(kFullMask, w_inclusive, d);
      if (lane >= d) w_inclusive += other;
    }
    if (lane < warps) s_scan[lane] = w_inclusive - w;
    if (lane == kWarpSize - 1) s_scan[kWarpSize] = w_inclusive;
  }
  __syncthreads();
  const int result = s_scan[warp] + inclusive - value;
  total = s_scan[kWarpSize];
  __syncthreads();  // s_scan may be reused by the next call
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

// Rows of s.expert[0, rows) with a local expert below `e`, and with `e`.
struct RowsBelow {
  int below;
  int equal;
};

__device__ __forceinline__ RowsBelow rows_below(const BlockShared& s, int rows, int e) {
  RowsBelow r{0, 0};
#pragma unroll 4
  for (int row = 0; row < rows; ++row) {
    const int v = s.expert[row];  // the same address across the warp: a broadcast
    r.below += v >= 0 && v < e;
    r.equal += v == e;
  }
  return r;
}

// Phases 2-4 for at most 32 rows, with no barrier: each thread counts the
// rows below and at its experts straight from s.expert, and warp 0, a lane
// per row, places the rows (rank among the lanes of the same expert) and
// writes the tiles, each expert's first lane its expert's. The same outputs
// as the general path; small inputs (decode) so run a short stretch of code.
__device__ void permute_one_piece(const BlockPermuteParams& p, const BlockShared& s) {
  const int tid = threadIdx.x, lane = tid % kWarpSize;
  const int num_local = p.num_local, rows = p.rows;
#pragma unroll 1
  for (int e = tid; e <= num_local; e += blockDim.x) {
    const RowsBelow c = rows_below(s, rows, e);
    p.expert_offsets[e] = c.below;  // e = num_local: every local row
    if (e < num_local) p.expert_counts[e] = c.equal;
  }
  if (tid >= kWarpSize) return;

  const unsigned lanes_below = (1u << lane) - 1u;
  const int row = lane;
  const int e = row < rows ? s.expert[row] : -1;
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
  const bool first_of_expert = e >= 0 && (same & lanes_below) == 0;
#pragma unroll 1
  for (int t = 0; t < kMaxTileSizes; ++t) {
    if (t >= p.num_tile_sizes) break;
    const int tile_m = p.tile_m[t];
    const int tiles = first_of_expert ? (count - 1) / tile_m + 1 : 0;
    // This expert's first tile: the tiles of the lower experts.
    int base = 0, num_tiles = 0;
#pragma unroll 8
    for (int l = 0; l < kWarpSize; ++l) {
      const int other_e = __shfl_sync(kFullMask, e, l);
      const int other_tiles = __shfl_sync(kFullMask, tiles, l);
      num_tiles += other_tiles;
      if (other_e < e) base += other_tiles;
    }
#pragma unroll 1
    for (int i = 0; i < tiles; ++i) {
      const int row_start = start + i * tile_m;
      p.tiles[t][base + i] = DeviceTile{e, row_start, min(tile_m, start + count - row_start), 0};
    }
    if (lane == 0) *p.num_tiles[t] = num_tiles;
  }
}

// Phases 2-4 over s.expert[0, rows); every thread of the block calls it.
__device__ void permute_block(const BlockPermuteParams& p, BlockShared& s) {
  if (p.rows <= kWarpSize) {
    permute_one_piece(p, s);
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
  const int per_thread = (num_local + threads - 1) / threads;
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
    const int tile_m = p.tile_m[t];
    int32_t* bases = s.work.words + t * (num_local + 1);
    int my_tiles = 0;
#pragma unroll 1
    for (int e = first; e < last; ++e) {
      const int count = s.offsets[e + 1] - s.offsets[e];
      my_tiles += count == 0 ? 0 : (count - 1) / tile_m + 1;  // no overflow for huge tile_m
    }
    int num_tiles = 0;
    int base = block_exclusive_sum(my_tiles, s.scan, num_tiles);
#pragma unroll 1
    for (int e = first; e < last; ++e) {
      bases[e] = base;
      const int count = s.offsets[e + 1] - s.offsets[e];
      base += count == 0 ? 0 : (count - 1) / tile_m + 1;
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

// Phase 1: this warp (this thread its lane `lane`) routes tokens begin +
// first_warp, + warp_stride, ... below end and stages each row's local
// expert in `staged` (this block's s.expert, or CTA 0's in the cluster
// variant). `keys`: as route_token's; with kStagedKeys, row i of E holds
// token begin + i's keys.
template <typename LogitT, int kPerLane, bool kDeepSeek, bool kStagedKeys>
__device__ __forceinline__ void route_tokens(const RoutingKernelParams& r, const BlockPermuteParams& p,
                                             float* keys, int16_t* staged, int lane, int begin,
                                             int end, int first_warp, int warp_stride) {
  for (int token = begin + first_warp; token < end; token += warp_stride) {  // uniform per warp
    float* token_keys = kStagedKeys ? keys + (token - begin) * r.num_experts : keys;
    const TokenChoice choice =
        route_token<LogitT, kPerLane, kDeepSeek, kStagedKeys>(r, token, lane, token_keys);
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
// several KB that a cold instruction cache fetches once per call).
template <typename LogitT>
__device__ void stage_deepseek_keys(const RoutingKernelParams& r, int begin, int end, float* keys) {
  const int num_experts = r.num_experts;
  const LogitT* logits =
      static_cast<const LogitT*>(r.logits) + static_cast<size_t>(begin) * num_experts;
  const int n = (end - begin) * num_experts;
  const int step = blockDim.x % num_experts;  // e = i % E, kept without dividing
  int e = threadIdx.x % num_experts;
#pragma unroll 1
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    keys[i] = deepseek_key(r, nan_to_neg_inf(load_logit(logits, i)), e);
    e += step;
    if (e >= num_experts) e -= num_experts;
  }
}

template <typename LogitT, int kPerLane, bool kDeepSeek>
__global__ void __launch_bounds__(fused_threads(kPerLane), 1)
    fused_routing_permute_kernel(RoutingKernelParams r, BlockPermuteParams p) {
  pdl_begin();
  pdl_launch_dependents();
  __shared__ BlockShared s;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  if constexpr (kDeepSeek) {
    // As many tokens' keys at a time as the work area holds (at least 8).
    const int chunk = kWorkWords / r.num_experts;
    for (int begin = 0; begin < r.num_tokens; begin += chunk) {
      const int end = min(begin + chunk, r.num_tokens);
      stage_deepseek_keys<LogitT>(r, begin, end, s.work.keys);
      __syncthreads();
      route_tokens<LogitT, kPerLane, true, true>(r, p, s.work.keys, s.expert, lane, begin, end,
                                                 warp, warps);
      __syncthreads();  // the next chunk's keys overwrite these
    }
  } else {
    float* group_keys = s.work.keys + warp * kPerLane * kWarpSize;
    route_tokens<LogitT, kPerLane, false, false>(r, p, group_keys, s.expert, lane, 0, r.num_tokens,
                                                 warp, warps);
  }
  __syncthreads();
  permute_block(p, s);
}

// The cluster variant (launched with a cluster of gridDim.x CTAs).
template <typename LogitT, int kPerLane, bool kDeepSeek>
__global__ void __launch_bounds__(fused_threads(kPerLane), 1)
    cluster_routing_permute_kernel(RoutingKernelParams r, BlockPermuteParams p) {
  pdl_begin();
  pdl_launch_dependents();
  __shared__ BlockShared s;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int ctas = static_cast<int>(cluster.num_blocks());
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  int16_t* staged = cluster.map_shared_rank(s.expert, 0);  // CTA 0's rows
  float* group_keys = s.work.keys + warp * kPerLane * kWarpSize;
  route_tokens<LogitT, kPerLane, kDeepSeek, false>(r, p, group_keys, staged, lane, 0, r.num_tokens,
                                                   rank * warps + warp, ctas * warps);
  // Release every CTA's staged rows to CTA 0 (and keep CTA 0 resident while
  // the others write to it).
  cluster.sync();
  if (rank != 0) return;
  permute_block(p, s);
}

// Precomputed ids, or no tokens: phases 2-4 only.
__global__ void __launch_bounds__(kMaxThreads, 1) fused_permute_kernel(BlockPermuteParams p) {
  pdl_begin();
  pdl_launch_dependents();
  __shared__ BlockShared s;
  for (int i = threadIdx.x; i < p.rows; i += blockDim.x)
    s.expert[i] = local_expert(p.topk_ids[i], p);
  __syncthreads();
  permute_block(p, s);
}

// Threads for a call: a warp per token and a thread per local expert (the
// scan phases give each thread a run of experts), whole warps, at least 4,
// at most what the kernel is built for. Small calls so get a small block,
// whose barriers are cheaper.
int block_threads(int max_threads, int num_tokens, int num_local) {
  const int wanted = max(max(num_tokens * kWarpSize, num_local), 4 * kWarpSize);
  return min(max_threads, (wanted + kWarpSize - 1) / kWarpSize * kWarpSize);
}

// CTAs of the cluster variant for T tokens: a warp per token, at most
// kClusterMaxCtas (the portable cluster size).
int cluster_ctas(int max_threads, int num_tokens) {
  const int warps = max_threads / kWarpSize;
  return min(kClusterMaxCtas, max(1, (num_tokens + warps - 1) / warps));
}

template <typename LogitT, int kPerLane, bool kDeepSeek>
void launch_width(const RoutingKernelParams& r, const BlockPermuteParams& p, bool cluster,
                  cudaStream_t stream) {
  constexpr int kMax = fused_threads(kPerLane);
  const int ctas = cluster ? cluster_ctas(kMax, r.num_tokens) : 1;
  if (ctas == 1) {
    launch_pdl(fused_routing_permute_kernel<LogitT, kPerLane, kDeepSeek>, 1,
               block_threads(kMax, r.num_tokens, p.num_local), 0, stream, r, p);
    return;
  }
  // CTA 0 also runs phases 2-4: a thread per local expert where it can.
  const int tokens_per_cta = (r.num_tokens + ctas - 1) / ctas;
  // One cluster of `ctas` CTAs.
  launch_pdl_clustered(cluster_routing_permute_kernel<LogitT, kPerLane, kDeepSeek>, ctas,
                       block_threads(kMax, tokens_per_cta, p.num_local), 0, ctas, stream, r, p);
}

template <typename LogitT, bool kDeepSeek>
void launch_routing_block(const RoutingKernelParams& r, const BlockPermuteParams& p, bool cluster,
                          cudaStream_t stream) {
  switch (slots_per_lane(r.num_experts)) {
    case 1: launch_width<LogitT, 1, kDeepSeek>(r, p, cluster, stream); break;
    case 2: launch_width<LogitT, 2, kDeepSeek>(r, p, cluster, stream); break;
    case 4: launch_width<LogitT, 4, kDeepSeek>(r, p, cluster, stream); break;
    case 8: launch_width<LogitT, 8, kDeepSeek>(r, p, cluster, stream); break;
    case 16: launch_width<LogitT, 16, kDeepSeek>(r, p, cluster, stream); break;
    default: launch_width<LogitT, 32, kDeepSeek>(r, p, cluster, stream); break;
  }
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
  p.local_offset = permute.local_offset;
  p.num_local = permute.num_local;
  p.expert_counts = permute.expert_counts;
  p.expert_offsets = permute.expert_offsets;
  p.permuted_to_expanded = permute.permuted_to_expanded;
  p.expanded_to_permuted = permute.expanded_to_permuted;
  p.num_tile_sizes = permute.num_tile_sizes;
  for (int s = 0; s < permute.num_tile_sizes; ++s) {
    p.tile_m[s] = permute.tile_m[s];
    p.tiles[s] = permute.tiles[s];
    p.num_tiles[s] = permute.num_tiles[s];
  }

  if (!route || rows == 0) {
    launch_pdl(fused_permute_kernel, 1, kMaxThreads, 0, stream, p);
  } else {
    const RoutingKernelParams r = make_routing_kernel_params(routing);
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

}  // namespace unimoe
