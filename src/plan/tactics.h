// The GEMM tactics the device library compiles, as plain host data: the
// plan picks among them, the kernels instantiate exactly these.
#pragma once

#include <string>

namespace unimoe {

// Tile shape of one mma.sync grouped-GEMM instantiation.
struct GemmTactic {
  int tile_m = 64;   // rows of a tile (must equal the schedule's tile_m)
  int tile_n = 128;  // output columns of a tile
  std::string to_string() const;  // "m64n128"
};

// The compiled mma tactics, best first for large T (src/kernels/grouped_gemm.cu
// instantiates one kernel for each and checks the list at compile time).
inline constexpr GemmTactic kMmaTactics[] = {{128, 128}, {64, 128}, {16, 128}, {16, 64}};
inline constexpr int kNumMmaTactics = sizeof(kMmaTactics) / sizeof(kMmaTactics[0]);

// One compiled CUTLASS configuration (src/kernels/sm90_grouped_gemm*.cu):
// kernel schedule and tile (BLK_M x BLK_N x BLK_K), cluster 1x1 for all.
enum class Sm90GemmTactic : int {
  Cooperative128x128,  // two consumer warp groups share a 128x128x64 tile
  Cooperative128x256,  // as above with a 128x256x64 tile: fewer B re-reads for large N
  Pingpong64x128,      // two consumer warp groups alternate 64x128x64 tiles
};

inline constexpr int kNumSm90GemmTactics = 3;

}  // namespace unimoe
