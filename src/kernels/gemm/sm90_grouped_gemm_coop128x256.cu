// The cooperative 128x256x64 tactic of the sm90 grouped GEMM: its only instantiation,
// alone in this file so that each tactic compiles on its own.
#include "kernels/gemm/sm90_grouped_gemm_impl.cuh"

namespace unimoe::sm90 {

const TacticEntry kCooperative128x256Entry{&Cooperative128x256::workspace_bytes, &Cooperative128x256::run};

}  // namespace unimoe::sm90
