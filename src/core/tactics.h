// The GEMM tactics the device library compiles, as plain host data: the
// plan picks among them, the kernels instantiate exactly these. Each prints
// and parses (the autotuner's cache stores them as text).
#pragma once

#include <string>

namespace unimoe {

// One mma.sync grouped-GEMM instantiation over a tile schedule of tile_m
// rows. Tiled: a CTA computes tile_m x tile_n of the output through shared
// memory. Stream (swap-AB, for decode): weight rows sit on the MMA's M side
// and a tile's rows (tokens) on its N side; warps stream weights straight
// from HBM into registers, split K inside the CTA and reduce in a fixed
// order. tile_n is 0 for a stream tactic: its column block follows K.
struct GemmTactic {
  int tile_m = 64;   // rows of a tile (must equal the schedule's tile_m)
  int tile_n = 128;  // output columns of a tile (0: stream)
  bool stream = false;
  // 0: the tile's standard build. Else a second build of the same tile that
  // keeps this many CTAs on an SM, with a shallower pipeline to fit them.
  int ctas_per_sm = 0;
  // Tiled with Hopper's warp-group MMA (wgmma, sm_90a) instead of mma.sync:
  // 128-row tiles, two warp groups (src/kernels/gemm/sm90_wgmma_gemm.cu).
  bool wgmma = false;
  std::string to_string() const;  // "m64n128", "m32n64x5", "stream_m16", "wg_m128n256"
};

constexpr bool operator==(const GemmTactic& a, const GemmTactic& b) {
  return a.tile_m == b.tile_m && a.tile_n == b.tile_n && a.stream == b.stream &&
         a.ctas_per_sm == b.ctas_per_sm && a.wgmma == b.wgmma;
}
constexpr bool operator!=(const GemmTactic& a, const GemmTactic& b) { return !(a == b); }

// The compiled mma tactics, best first for large T
// (src/kernels/gemm/grouped_gemm.cu instantiates one kernel for each and
// checks the list at compile time).
inline constexpr GemmTactic kMmaTactics[] = {
    {128, 128}, {64, 128}, {48, 128}, {32, 64},  {32, 64, false, 5},         {16, 128},
    {16, 64},   {16, 32},  {128, 256, false, 0, true}, {128, 128, false, 0, true}, {16, 0, true}};
inline constexpr int kNumMmaTactics = sizeof(kMmaTactics) / sizeof(kMmaTactics[0]);

// The FP8 variants on the mma path run one kernel, the FP8 wgmma GEMM
// (src/kernels/gemm/sm90_fp8_wgmma_gemm.cu), named by its tile: this pair
// for both GEMMs, over 128-row tiles.
inline constexpr GemmTactic kFp8MmaTactic = {128, 128, false, 0, true};

// "m16n64" -> {16, 64}, "m32n64x5" -> {32, 64, false, 5}, "stream_m16" ->
// {16, 0, true}, "wg_m128n256" -> {128, 256, false, 0, true}. Throws Error (field "mma_tactic") listing the compiled
// tactics when `s` is not one of kMmaTactics.
GemmTactic parse_gemm_tactic(const std::string& s);

// K splits of the stream kernel (its 8 warps split K 1, 2, 4 or 8 ways;
// a CTA covers 8 / splits row groups of 8 gated or 16 plain output
// columns). The largest split that leaves each warp at least 256 of K,
// except that 8 splits become 4 when the 8-split grid (max_tiles x column
// blocks) would take 1.5 to 6 waves of 2 CTAs an SM: then half as many CTAs,
// each warp with twice the pairs, waste less in partial waves. Measured on
// an H200 (stream-path GEMMs at T=1 and 8, us with 8 splits -> 4):
// taken at 1.9-5.8 waves it was faster (qwen3-30b-a3b GEMM1 at 2.9 waves
// 15.3 -> 14.1 us, gpt-oss-120b GEMM1 at 5.5 waves 34.3 -> 32.2 and GEMM2
// at 2.7 waves 17.9 -> 16.7, mixtral-8x7b GEMM2 at 1.9 waves 53.3 -> 51.8,
// qwen3-235b-a22b GEMM1 at 5.8 waves 48.4 -> 48.1); left alone below 1.5
// waves (dsv3-tp8 GEMM1 at 0.97: 15.9 -> 16.3) and above 6 (dsv3-tp8 T=8
// GEMM1 at 7.8: 96.0 -> 98.2; mixtral-8x7b GEMM1 at 13.6: 105.4 -> 108.6).
// max_splits (1..8) caps the result (UNIMOE_STREAM_MAX_SPLITS, which also
// turns the wave rule off, for A/B timing); sm_count <= 0 skips the rule.
int stream_k_splits(int k, int n_out, bool gated, long long max_tiles, int sm_count,
                    int max_splits = 8);

// One compiled CUTLASS configuration (src/kernels/gemm/sm90_grouped_gemm*.cu):
// kernel schedule and tile (BLK_M x BLK_N x BLK_K), cluster 1x1 for all.
enum class Sm90GemmTactic : int {
  Cooperative128x128,  // two consumer warp groups share a 128x128x64 tile
  Cooperative128x256,  // as above with a 128x256x64 tile: fewer B re-reads for large N
  Pingpong64x128,      // two consumer warp groups alternate 64x128x64 tiles
};

// Every compiled CUTLASS tactic, in enum order.
inline constexpr Sm90GemmTactic kSm90GemmTactics[] = {
    Sm90GemmTactic::Cooperative128x128, Sm90GemmTactic::Cooperative128x256,
    Sm90GemmTactic::Pingpong64x128};
inline constexpr int kNumSm90GemmTactics = sizeof(kSm90GemmTactics) / sizeof(kSm90GemmTactics[0]);

// "coop_128x128x64", "coop_128x256x64", "pingpong_64x128x64".
std::string to_string(Sm90GemmTactic t);
// Throws Error (field "sm90_tactic") naming the allowed values.
Sm90GemmTactic parse_sm90_gemm_tactic(const std::string& s);

// One compiled configuration of the FP8 blockwise-scaled grouped GEMM
// (src/kernels/gemm/sm90_fp8_grouped_gemm_*.cu): kernel schedule and tile
// (BLK_M x BLK_N x BLK_K) and cluster. BLK_K is 128 for all, one scale
// block deep.
enum class Sm90Fp8GemmTactic : int {
  Cooperative128x128,  // two consumer warp groups share a 128x128x128 tile
  Pingpong64x128,      // two consumer warp groups alternate 64x128x128 tiles
  // The cooperative tile on clusters of 2 CTAs along M, which share each B
  // (weight) tile through a TMA multicast: half the B reads from L2.
  Cooperative128x128Cluster2x1,
};

// Every compiled FP8 tactic, in enum order.
inline constexpr Sm90Fp8GemmTactic kSm90Fp8GemmTactics[] = {
    Sm90Fp8GemmTactic::Cooperative128x128, Sm90Fp8GemmTactic::Pingpong64x128,
    Sm90Fp8GemmTactic::Cooperative128x128Cluster2x1};

// "fp8_coop_128x128x128", "fp8_pingpong_64x128x128", "fp8_coop_128x128x128_c2x1".
const char* to_string(Sm90Fp8GemmTactic t);
// Throws Error (field "fp8_tactic") naming the allowed values.
Sm90Fp8GemmTactic parse_sm90_fp8_gemm_tactic(const std::string& s);

}  // namespace unimoe
