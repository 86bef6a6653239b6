// Permutation floor probe (development only; built by hand, not by CMake):
// how many cycles one block takes from its rows staged in shared memory to
// the whole permutation and tile schedule written, at the decode shapes
// where CTA 0 of the cluster kernel takes the token masks (T * K of
// 65..512). Five forms over the same staged rows:
//   - one size: permute_block_on_path
//     (src/kernels/permute/block_permute.cuh) as CTA 0 of the cluster kernel
//     calls it, its path chosen before the timed region (K = 8 up to T = 64
//     takes a constant form of the token masks), the masks cleared first (as
//     CTA 0 clears them before its cluster barrier), one tile size (16, as
//     the routing sweep asks and the layer asks one): lay_out_one_size;
//   - three sizes: the same with tile sizes 16, 64 and 128: lay_out_packed,
//     the token masks' layout for several tile sizes;
//   - fixed: the one-size algorithm in a kernel of its own with E, K, T,
//     the tile size and the block size known at compile time, for the
//     floor of the algorithm;
//   - K,words fixed: the same kernel with only K and the mask words
//     (T / 32) as template constants;
//   - masks direct: the library's permute_by_token_masks with K and the
//     mask words as constants, called in a kernel of its own.
// Each launch is one block that runs the form twice (the second pass finds
// its code in the SM's caches); thread 0 reads clock64 after the staging
// barrier and after the form's last barrier. The probe prints the median over
// the launches of each pass and checks that the forms' counts, offsets, rows
// and first tile schedule agree. Its H200 figures are quoted where the
// library cites them (kernels/permute/block_permute_masks.cuh).
//
// Build (from the repository root) and run on a GPU:
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -Isrc -Iinclude \
//     bench/probes/permute_floor.cu -o /tmp/permute_floor && /tmp/permute_floor [launches]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/exact_quotient.h"
#include "kernels/permute/block_permute.cuh"
#include "probe_check.h"

using namespace unimoe;
using namespace unimoe::fused_detail;

// Stages the rows, clears the token masks and warms the parameters; then
// runs `permute` twice, clock64 around each pass (cycles[pass]), the masks
// cleared again after each.
template <class Permute>
__device__ __forceinline__ void time_two_passes(const BlockPermuteParams& p, BlockShared& s,
                                                const int16_t* rows, long long* cycles,
                                                Permute permute) {
  for (int i = threadIdx.x; i < p.rows; i += blockDim.x) s.expert[i] = rows[i];
  clear_token_masks(p, s);
  if ((touch_params(p) ^ 0x9e3779b9u) == 0u) s.scan[kWarpSize] = 0;  // warm the parameters
  __syncthreads();
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    const long long t0 = clock64();
    permute();
    __syncthreads();
    if (threadIdx.x == 0) cycles[pass] = clock64() - t0;
    clear_token_masks(p, s);
    __syncthreads();
  }
}

// Cycles a pass, at cycles[pass]: permute_block_on_path, its path chosen
// before the passes as CTA 0 chooses it before its barrier.
__global__ void library_kernel(const __grid_constant__ BlockPermuteParams p, const int16_t* rows,
                               long long* cycles) {
  __shared__ BlockShared s;
  const BlockPermutePath path = block_permute_path<true>(p);
  time_two_passes(p, s, rows, cycles, [&] { permute_block_on_path<true>(p, s, path, true); });
}

// The library's token masks with K and the mask words as constants
// (permute_by_token_masks<kK, kWords>), called in a kernel of its own
// rather than through permute_block.
template <int kK, int kWords>
__global__ void __launch_bounds__(1024, 1)
    masks_kernel(const __grid_constant__ BlockPermuteParams p, const int16_t* rows,
                 long long* cycles) {
  __shared__ BlockShared s;
  time_two_passes(p, s, rows, cycles, [&] { permute_by_token_masks<kK, kWords>(p, s, true); });
}

// lay_out_one_size's algorithm with K and the mask words (T / 32) as
// template constants, and E, T, the tile size and the block size as well
// where their template value is not 0 (0: at run time, from p and
// blockDim). All of them constant: "fixed"; only K and the words: "K,words
// fixed".
template <int kK, int kWords, int kE, int kT, int kTileM, int kThreads>
__global__ void __launch_bounds__(kThreads > 0 ? kThreads : 1024, 1)
    constant_kernel(const __grid_constant__ BlockPermuteParams p, const int16_t* rows,
                    long long* cycles) {
  static_assert(kE == 0 || kE <= kThreads, "an expert a thread");
  constexpr int kUnroll = kT > 0 ? 16 : 1;  // the row loops: whole where T is known
  __shared__ BlockShared s;
  const int threads = kThreads > 0 ? kThreads : static_cast<int>(blockDim.x);
  const int num_local = kE > 0 ? kE : p.num_local;
  const int n = kT > 0 ? kT * kK : p.rows;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  uint32_t* masks = reinterpret_cast<uint32_t*>(s.work.words);  // [num_local][kWords]
  uint32_t* warp_totals = reinterpret_cast<uint32_t*>(s.scan);
  for (int i = tid; i < n; i += threads) s.expert[i] = rows[i];
  for (int i = tid; i < num_local * kWords; i += threads) masks[i] = 0;
  if ((touch_params(p) ^ 0x9e3779b9u) == 0u) s.scan[kWarpSize] = 0;  // warm the parameters
  __syncthreads();
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    const long long t0 = clock64();
#pragma unroll kUnroll
    for (int row = tid; row < n; row += threads) {
      const int e = s.expert[row], token = row / kK;
      if (e >= 0) atomicOr(&masks[e * kWords + token / 32], 1u << (token % 32));
    }
    __syncthreads();
    const int owners = max((num_local + 31) / 32, 1);
    uint32_t mine = 0, inclusive = 0;
    if (warp < owners) {
      int count = 0;
      if (tid < num_local) {
#pragma unroll
        for (int w = 0; w < kWords; ++w) count += __popc(masks[tid * kWords + w]);
      }
      const int tiles = kTileM > 0 ? (count + kTileM - 1) / kTileM
                        : count == 0 ? 0
                                     : exact_quotient(count - 1, p.inv_tile_m[0]) + 1;
      mine = static_cast<uint32_t>(count) | (static_cast<uint32_t>(tiles) << 16);
      inclusive = warp_inclusive_sum(mine, lane);
      if (lane == 31) warp_totals[warp] = inclusive;
    }
    __syncthreads();
    if (warp < owners) {
      const uint32_t t = lane < owners ? warp_totals[lane] : 0u;
      uint32_t below = lane < warp ? t : 0u, total = t;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        below += __shfl_xor_sync(kFullMask, below, d);
        total += __shfl_xor_sync(kFullMask, total, d);
      }
      const uint32_t before = below + inclusive - mine;
      const int start = static_cast<int>(before & 0xffffu), count = static_cast<int>(mine & 0xffffu);
      if (tid < num_local) {
        const int tile_base = static_cast<int>(before >> 16);
        const int tile_m = kTileM > 0 ? kTileM : p.tile_m[0];
        s.offsets[tid] = start;
        p.expert_offsets[tid] = start;
        p.expert_counts[tid] = count;
#pragma unroll 1
        for (int i = 0; i * tile_m < count; ++i)
          p.tiles[0][tile_base + i] =
              DeviceTile{tid, start + i * tile_m, min(tile_m, count - i * tile_m), 0};
      }
      if (tid == 0) {
        p.expert_offsets[num_local] = static_cast<int>(total & 0xffffu);
        *p.num_tiles[0] = static_cast<int>(total >> 16);
      }
    }
    __syncthreads();
#pragma unroll kUnroll
    for (int row = tid; row < n; row += threads) {
      const int e = s.expert[row];
      if (e < 0) {
        p.expanded_to_permuted[row] = -1;
        continue;
      }
      const int token = row / kK;
      const uint32_t* mask = masks + e * kWords;
      int rank = __popc(mask[token / 32] & ((1u << (token % 32)) - 1u));
#pragma unroll
      for (int w = 0; w < kWords - 1; ++w) rank += w < token / 32 ? __popc(mask[w]) : 0;
      const int dst = s.offsets[e] + rank;
      p.permuted_to_expanded[dst] = row;
      p.expanded_to_permuted[row] = dst;
    }
    __syncthreads();
    if (tid == 0) cycles[pass] = clock64() - t0;
    for (int i = tid; i < num_local * kWords; i += threads) masks[i] = 0;
    __syncthreads();
  }
}

constexpr int kSizes = 3;
constexpr int kTileSizes[kSizes] = {16, 64, 128};

struct Buffers {
  int32_t *counts, *offsets, *p2e, *e2p;
  int32_t* num_tiles[kSizes];
  DeviceTile* tiles[kSizes];
};

static Buffers make_buffers(int e, int rows) {
  Buffers b{};
  CHECK(cudaMalloc(&b.counts, e * 4));
  CHECK(cudaMalloc(&b.offsets, (e + 1) * 4));
  CHECK(cudaMalloc(&b.p2e, rows * 4));
  CHECK(cudaMalloc(&b.e2p, rows * 4));
  CHECK(cudaMemset(b.counts, 0xff, e * 4));  // poisoned: every output is written
  CHECK(cudaMemset(b.offsets, 0xff, (e + 1) * 4));
  CHECK(cudaMemset(b.p2e, 0xff, rows * 4));
  CHECK(cudaMemset(b.e2p, 0xff, rows * 4));
  for (int t = 0; t < kSizes; ++t) {
    CHECK(cudaMalloc(&b.num_tiles[t], 4));
    CHECK(cudaMalloc(&b.tiles[t], (rows + e) * sizeof(DeviceTile)));
    CHECK(cudaMemset(b.num_tiles[t], 0xff, 4));
    CHECK(cudaMemset(b.tiles[t], 0xff, (rows + e) * sizeof(DeviceTile)));
  }
  return b;
}

template <typename T>
static std::vector<T> fetch(const T* d, int n) {
  std::vector<T> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// Whether two forms wrote the same counts, offsets, rows and first tile
// schedule (tile size 16 in both).
static bool same(const Buffers& a, const Buffers& b, int e, int rows) {
  const int tiles = fetch(a.num_tiles[0], 1)[0];
  if (fetch(b.num_tiles[0], 1)[0] != tiles || tiles < 0 || tiles > rows + e) return false;
  const auto ta = fetch(a.tiles[0], tiles), tb = fetch(b.tiles[0], tiles);
  for (int i = 0; i < tiles; ++i)
    if (ta[i].expert != tb[i].expert || ta[i].row_start != tb[i].row_start ||
        ta[i].rows != tb[i].rows)
      return false;
  return fetch(a.counts, e) == fetch(b.counts, e) &&
         fetch(a.offsets, e + 1) == fetch(b.offsets, e + 1) &&
         fetch(a.p2e, rows) == fetch(b.p2e, rows) && fetch(a.e2p, rows) == fetch(b.e2p, rows);
}

static long long median(std::vector<long long> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <int kE, int kK, int kT, int kThreads>
static void run_shape(int launches) {
  constexpr int kRows = kT * kK;
  std::mt19937 rng(1234 + kE + kT);
  std::vector<int16_t> rows(kRows);
  for (int t = 0; t < kT; ++t) {  // K distinct experts a token, uniform
    std::vector<int> ids(kE);
    for (int i = 0; i < kE; ++i) ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int k = 0; k < kK; ++k) rows[t * kK + k] = static_cast<int16_t>(ids[k]);
  }
  int16_t* d_rows;
  long long* d_cycles;
  CHECK(cudaMalloc(&d_rows, kRows * 2));
  CHECK(cudaMalloc(&d_cycles, 2 * sizeof(long long)));
  CHECK(cudaMemcpy(d_rows, rows.data(), kRows * 2, cudaMemcpyHostToDevice));
  constexpr int kForms = 5;
  const char* names[kForms] = {"one size", "three sizes", "fixed", "K,words fixed",
                               "masks direct"};
  Buffers buf[kForms];
  BlockPermuteParams p[kForms];
  for (int f = 0; f < kForms; ++f) {
    buf[f] = make_buffers(kE, kRows);
    BlockPermuteParams q{};
    q.rows = kRows;
    q.top_k = kK;
    q.distinct_per_token = true;
    q.sorted_pair = true;
    q.num_local = kE;
    q.expert_counts = buf[f].counts;
    q.expert_offsets = buf[f].offsets;
    q.permuted_to_expanded = buf[f].p2e;
    q.expanded_to_permuted = buf[f].e2p;
    q.num_tile_sizes = f == 1 ? kSizes : 1;
    for (int t = 0; t < q.num_tile_sizes; ++t) {
      q.tile_m[t] = kTileSizes[t];
      q.tiles[t] = buf[f].tiles[t];
      q.num_tiles[t] = buf[f].num_tiles[t];
      q.inv_tile_m[t] = inverse_of(kTileSizes[t]);
    }
    q.inv_top_k = inverse_of(kK);
    p[f] = for_block(q, kThreads);
  }
  std::vector<long long> c[kForms][2];  // [form][pass]
  for (int i = 0; i < launches; ++i) {
    for (int f = 0; f < kForms; ++f) {
      CHECK(cudaMemset(d_cycles, 0, 2 * sizeof(long long)));
      constexpr int kWords = (kT + 31) / 32;
      if (f == 2)
        constant_kernel<kK, kWords, kE, kT, kTileSizes[0], kThreads>
            <<<1, kThreads>>>(p[f], d_rows, d_cycles);
      else if (f == 3)
        constant_kernel<kK, kWords, 0, 0, 0, 0><<<1, kThreads>>>(p[f], d_rows, d_cycles);
      else if (f == 4)
        masks_kernel<kK, kWords><<<1, kThreads>>>(p[f], d_rows, d_cycles);
      else
        library_kernel<<<1, kThreads>>>(p[f], d_rows, d_cycles);
      CHECK(cudaGetLastError());
      const auto h = fetch(d_cycles, 2);
      for (int pass = 0; pass < 2; ++pass) c[f][pass].push_back(h[pass]);
    }
  }
  std::printf("E=%4d K=%d T=%3d rows=%4d threads=%4d:", kE, kK, kT, kRows, kThreads);
  for (int f = 0; f < kForms; ++f)
    std::printf("  %s %5lld / %5lld", names[f], median(c[f][0]), median(c[f][1]));
  const bool match = same(buf[0], buf[1], kE, kRows) && same(buf[0], buf[2], kE, kRows) &&
                     same(buf[0], buf[3], kE, kRows) && same(buf[0], buf[4], kE, kRows);
  std::printf("  %s\n", match ? "outputs agree" : "OUTPUTS DIFFER");
  CHECK(cudaFree(d_rows));
  CHECK(cudaFree(d_cycles));
}

int main(int argc, char** argv) {
  const int launches = argc > 1 ? std::atoi(argv[1]) : 51;
  std::printf(
      "cycles from the staged rows to the permutation written, first / second pass of a launch, "
      "median over %d launches\n",
      launches);
  run_shape<128, 8, 64, 320>(launches);   // Renormalize E=128 K=8 T=64: CTA 0 of 8 x 320
  run_shape<128, 8, 64, 1024>(launches);
  run_shape<128, 8, 16, 320>(launches);
  run_shape<256, 8, 64, 1024>(launches);  // DeepSeekV3 E=256 K=8 T=64: CTA 0 of 14 x 1024
  run_shape<256, 8, 32, 1024>(launches);
  run_shape<256, 8, 16, 1024>(launches);
  run_shape<64, 4, 64, 256>(launches);
  run_shape<512, 8, 32, 1024>(launches);
  return 0;
}
