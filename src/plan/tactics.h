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
  std::string to_string() const;  // "m64n128", "stream_m16"
};

constexpr bool operator==(const GemmTactic& a, const GemmTactic& b) {
  return a.tile_m == b.tile_m && a.tile_n == b.tile_n && a.stream == b.stream;
}
constexpr bool operator!=(const GemmTactic& a, const GemmTactic& b) { return !(a == b); }

// The compiled mma tactics, best first for large T (src/kernels/grouped_gemm.cu
// instantiates one kernel for each and checks the list at compile time).
inline constexpr GemmTactic kMmaTactics[] = {
    {128, 128}, {64, 128}, {32, 64}, {16, 128}, {16, 64}, {16, 32}, {16, 0, true}};
inline constexpr int kNumMmaTactics = sizeof(kMmaTactics) / sizeof(kMmaTactics[0]);

// "m16n64" -> {16, 64}, "stream_m16" -> {16, 0, true}. Throws Error (field "mma_tactic") listing the
// compiled tactics when `s` is not one of kMmaTactics.
GemmTactic parse_gemm_tactic(const std::string& s);

// One compiled CUTLASS configuration (src/kernels/sm90_grouped_gemm*.cu):
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

}  // namespace unimoe
