// The cooperative 128x128x128 tactic on 2x1 clusters of the sm90 FP8 grouped GEMM with a
// fp32 D: its only instantiation, alone in this file so that each kernel compiles on its own.
#include "kernels/gemm/sm90_fp8_grouped_gemm_impl.cuh"

namespace unimoe::sm90_fp8 {

const TacticEntry kCooperative128x128Cluster2x1F32Entry{
    &Cooperative128x128Cluster2x1<float>::workspace_bytes,
    &Cooperative128x128Cluster2x1<float>::run};

}  // namespace unimoe::sm90_fp8
