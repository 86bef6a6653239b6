// The roofline floor of one MoE layer call: the larger of (bytes that must
// move / measured bandwidth) and (FLOPs / measured tensor-core rate).
#pragma once

#include <vector>

#include "unimoe/unimoe.h"

namespace unimoe {

struct Ceilings {
  double bandwidth_tbps = 0;  // the floors' HBM bandwidth, TB/s: the higher of the two below
  double matmul_tflops = 0;   // measured dense bf16 matmul rate
  double fp8_matmul_tflops = 0;  // measured dense e4m3 matmul rate (the FP8 variants' ceiling)
  double copy_tbps = 0;       // a 2 GiB copy kernel, bytes read plus written (0: not measured)
  double read_tbps = 0;       // a 2 GiB read-only stream (0: not measured)
};

// The bandwidth a run's floors use: the faster of the copy and the read.
inline double floor_bandwidth(double copy_tbps, double read_tbps) {
  return copy_tbps > read_tbps ? copy_tbps : read_tbps;
}

struct FloorEstimate {
  double bytes = 0;   // weights of the experts hit + x in + out + logits
  double flops = 0;   // 2 * T * K * (gemm1_cols + I) * H
  double memory_us = 0;
  double compute_us = 0;
  double floor_us = 0;  // max of the two
};

// Bytes per weight value of a quant variant, scales included.
double weight_bytes_per_value(QuantVariant q);

// Expected distinct experts hit by T tokens routed uniformly at random.
double expected_active_experts(int num_experts, int top_k, int num_tokens);

// The floor: bytes over bandwidth_tbps, flops over the rate of the config's
// operands (fp8_matmul_tflops for the FP8 variants, matmul_tflops else).
FloorEstimate layer_floor(const MoEConfig& config, int num_tokens, double active_experts,
                          const Ceilings& ceilings);

// One stage's own floor: the least traffic its contract (docs/design.md,
// "Stage contracts") moves and the FLOPs it does, against the same
// ceilings. The stages' floors add up to more than the layer's, which has
// no intermediates; the difference is what the split chain costs.
//   routing: logits in, top-k ids and weights out;
//   permute: ids in, the two permutation maps out (counts are negligible);
//   gemm1: W13 of the experts hit, x once, act out (bf16; e4m3 plus a
//     scale per 128 values for the FP8 variants);
//   gemm2: W2 of the experts hit, act in, y out (bf16);
//   finalize: y in, out written.
struct StageFloor {
  const char* stage = "";  // stage_name() of the layer's stage
  double bytes = 0;
  double flops = 0;
  double floor_us = 0;
};
std::vector<StageFloor> stage_floors(const MoEConfig& config, int num_tokens, double active_experts,
                                     const Ceilings& ceilings);

}  // namespace unimoe
