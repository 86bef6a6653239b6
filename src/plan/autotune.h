// The host half of MoELayer::autotune (src/layer/autotune.cu): the checked
// options, the token buckets to tune with the T each is timed at, and the
// metric of the reference check (the inputs are ref::synthetic_inputs).
// Pure host code, tested on the CPU (tests/cpu/test_autotune.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "unimoe/unimoe.h"

namespace unimoe {

// A candidate passes the reference check below this relative L2 error: bf16
// operands, fp32 accumulation, bf16 intermediates (the GPU tests' bound;
// measured errors are 2e-3..5e-3).
inline constexpr double kTuningTolerance = 1e-2;
// The FP8 variants' bound, the same. The weights and the device's
// quantization of each GEMM input follow the reference's rule exactly, on
// GEMM1 outputs kept in fp32 (a bf16 GEMM1 output moved about one
// intermediate element in 30 to the neighbouring e4m3 code: 1.4e-2 to
// 3.9e-2 of error, measured on an H100); what differs is fp32 accumulation
// order, which moves an element across an e4m3 rounding boundary only
// rarely, and y and the output rounded to bf16, as for BF16.
inline constexpr double kFp8Tolerance = 1e-2;

// The largest relative L2 error against the CPU reference that a GPU
// forward of `quant` may show (the benchmark fails a point above it; the
// tuner rejects a candidate): kTuningTolerance for BF16 and the W4A16
// variants (MXFP4, NVFP4), kFp8Tolerance for the FP8 variants
// (docs/benchmarking.md, "Correctness").
double reference_tolerance(QuantVariant quant);

// Input sets (fresh x and logits each) in one timed graph, so that a
// candidate is not timed on one set's experts held in L2.
inline constexpr int kAutotuneInputSets = 4;

// One bucket to tune and the token count its candidates run at.
struct AutotuneTarget {
  int bucket = 1;
  int num_tokens = 1;
};

bool operator==(const AutotuneTarget& a, const AutotuneTarget& b);

// Throws Error naming the field ("autotune.tokens", "autotune.routing",
// "autotune.iters", "autotune.check_tokens") and what is allowed on the
// first bad value, for a layer of `max_tokens`.
void check_autotune_options(const AutotuneOptions& options, int max_tokens);

// The buckets to tune, in increasing order, after check_autotune_options:
// the buckets of options.tokens, each run at the largest count listed for
// it; empty tokens: every bucket of token_buckets(max_tokens), each run at
// min(bucket, max_tokens).
std::vector<AutotuneTarget> autotune_targets(const AutotuneOptions& options, int max_tokens);

// Relative L2 error of bf16 output bits against the fp32 reference (same
// length): sqrt(sum (got - want)^2 / sum want^2); infinite for a NaN, a
// length mismatch, or a non-zero output against an all-zero reference.
double relative_l2_error(const std::vector<uint16_t>& got_bits, const std::vector<float>& want);

}  // namespace unimoe
