// The roofline floor of one MoE layer call: the larger of (bytes that must
// move / measured bandwidth) and (FLOPs / measured tensor-core rate).
#pragma once

#include "unimoe/unimoe.h"

namespace unimoe {

struct Ceilings {
  double bandwidth_tbps = 0;  // measured HBM bandwidth, TB/s (read + write)
  double matmul_tflops = 0;   // measured dense matmul rate for the variant's operands
};

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

FloorEstimate layer_floor(const MoEConfig& config, int num_tokens, double active_experts,
                          const Ceilings& ceilings);

}  // namespace unimoe
