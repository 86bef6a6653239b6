// The pingpong 64x128x128 tactic of the sm90 FP8 grouped GEMM: its only
// instantiation, alone in this file so that each tactic compiles on its own.
#include "kernels/gemm/sm90_fp8_grouped_gemm_impl.cuh"

namespace unimoe::sm90_fp8 {

const TacticEntry kPingpong64x128Entry{&Pingpong64x128::workspace_bytes, &Pingpong64x128::run};

}  // namespace unimoe::sm90_fp8
