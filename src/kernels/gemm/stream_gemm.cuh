// The stream (swap-AB) grouped GEMM for decode: weights on the MMA's M side,
// the tile's tokens on its N side, weights loaded from HBM straight into
// registers. Serves the schedules of 16-row tiles (two n8 token fragments).
#pragma once

#include <cuda_runtime.h>

#include "kernels/common/common.cuh"
#include "kernels/gemm/grouped_gemm_args.cuh"

namespace unimoe {

// Launches over max_tiles tiles of at most kStreamTileM rows each. Fills
// args.n_blocks. The caller has checked k and n_out (multiples of 8).
inline constexpr int kStreamTileM = 16;

// How the plan wants the stream kernel launched.
struct StreamGemmOptions {
  int max_splits = 0;     // K splits at most (1, 2, 4, 8); 0: stream_k_splits' rule with its waves
  bool one_token = true;  // one-row tiles take the one-token path
};
void launch_stream_gemm(GroupedGemmArgs args, int max_tiles, const StreamGemmOptions& options,
                        KernelStream stream);

}  // namespace unimoe
