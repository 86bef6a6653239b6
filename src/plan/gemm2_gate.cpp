#include "plan/gemm2_gate.h"

namespace unimoe {
namespace {

// The model's constants (ns and bytes per ns).
//
// Both paths stream W2 once per pass over an expert's rows: the expert path
// once per tile of the schedule, the combine path once per 16-row chunk
// (its passes over a tile of more rows re-read the same W2 slice, mostly
// from L2). What differs is what each does around that:
//   - the expert path writes y (rows x H bf16) and the finalize reads it
//     back, and the finalize is one more kernel in the chain: its stage time
//     at T = 1 is 1.9-2.2 us on an H100 (bench/results/h100/layer-fp8.txt,
//     dsv3-tp8, qwen3-30b-a3b and qwen3-235b-a22b), about all of it launch
//     and latency;
//   - the combine path re-reads W2 for every 16-row chunk past a tile's
//     first, at the L2's rate rather than HBM's.
// kHbmBytesPerNs is an H100's copy rate (2.86-2.90 TB/s measured in the
// FP8 layer runs); the L2 re-read rate is taken as 2.5x that. These
// are first-principles figures, not yet fitted to a sweep of the two forced
// paths; docs/gemm2-gate.md says how to fit them.
constexpr float kHbmBytesPerNs = 2860.0f;
constexpr float kL2RereadBytesPerNs = 2.5f * kHbmBytesPerNs;
constexpr float kFinalizeBaseNs = 1900.0f;

}  // namespace

const char* gemm2_mode_name(Gemm2Mode m) {
  switch (m) {
    case Gemm2Mode::Expert: return "expert";
    case Gemm2Mode::Combine: return "combine";
    case Gemm2Mode::Gate: return "gate";
  }
  return "?";
}

bool combine_serves(const MoEConfig& config, int num_tokens) {
  const long long rows = static_cast<long long>(num_tokens) * config.routing.top_k;
  return config.experts.quant == QuantVariant::BF16 && rows >= 1 && rows <= kCombineMaxRows;
}

Gemm2GateModel gemm2_gate_model(const MoEConfig& config) {
  const float hidden = static_cast<float>(config.experts.hidden);
  const float w2_bytes = hidden * static_cast<float>(config.experts.intermediate) * 2.0f;
  Gemm2GateModel m;
  m.expert.base = kFinalizeBaseNs;
  m.expert.per_tile = w2_bytes / kHbmBytesPerNs;
  m.expert.per_row = 4.0f * hidden / kHbmBytesPerNs;  // y: 2 bytes written, 2 read per value
  // combine = tiles x (one HBM read) + (chunks - tiles) x (one L2 re-read)
  m.combine.per_chunk = w2_bytes / kL2RereadBytesPerNs;
  m.combine.per_tile = w2_bytes / kHbmBytesPerNs - m.combine.per_chunk;
  return m;
}

}  // namespace unimoe
