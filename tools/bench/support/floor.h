// The roofline floor of one MoE layer call: the larger of (bytes that must
// move / measured bandwidth) and (FLOPs / measured tensor-core rate).
#pragma once

#include "unimoe/unimoe.h"

namespace unimoe {

struct Ceilings {
  double bandwidth_tbps = 0;  // measured HBM bandwidth, TB/s (read + write)
  double matmul_tflops = 0;   // measured dense bf16 matmul rate
  double fp8_matmul_tflops = 0;  // measured dense e4m3 matmul rate (the FP8 variants' ceiling)
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

// The floor: bytes over bandwidth_tbps, flops over the rate of the config's
// operands (fp8_matmul_tflops for the FP8 variants, matmul_tflops else).
FloorEstimate layer_floor(const MoEConfig& config, int num_tokens, double active_experts,
                          const Ceilings& ceilings);

}  // namespace unimoe
