#include "plan/gemm2_gate.h"

namespace unimoe {
namespace {

// The model's constants (ns and bytes per ns).
//
// Both paths stream W2 once per pass over an expert's rows: the expert path
// once per tile of the schedule, the combine path once per 16-row chunk
// (its passes over a tile of more rows re-read the same W2 slice, mostly
// from L2). In the gated chain both end in the same two kernels after
// GEMM1 (the expert GEMM2, empty for the combine, then the tail that runs
// the combine or the finalize), so the finalize's launch is no longer a
// difference. What differs:
//   - the expert path writes y (rows x H bf16) and the finalize reads it
//     back;
//   - the combine path re-reads W2 for every 16-row chunk past a tile's
//     first, at the L2's rate rather than HBM's;
//   - the combine kernel's own GEMM is slower than the stream kernel's at
//     decode: in the H100 sweep of the forced paths
//     (bench/results/h100/gemm2-gate-sweep.txt, T = 1) the combine path was
//     0.3-1.3 us slower than the expert path although the expert path ran
//     the finalize kernel too (1.9-2.2 us of stage time at T = 1,
//     bench/results/h100/layer-fp8.txt), so about 2 to 3 us slower for the
//     GEMM: kCombineBaseNs.
// kHbmBytesPerNs is an H100's copy rate (2.86-2.90 TB/s measured in the
// FP8 layer runs); the L2 re-read rate is taken as 2.5x that. These are
// first-principles figures and H100 differences, not a fit of the gated
// chain on an H200; docs/gemm2-gate.md says how to fit them.
constexpr float kHbmBytesPerNs = 2860.0f;
constexpr float kL2RereadBytesPerNs = 2.5f * kHbmBytesPerNs;
constexpr float kCombineBaseNs = 2000.0f;

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
  m.combine.base = kCombineBaseNs;
  m.expert.per_tile = w2_bytes / kHbmBytesPerNs;
  m.expert.per_row = 4.0f * hidden / kHbmBytesPerNs;  // y: 2 bytes written, 2 read per value
  // combine = tiles x (one HBM read) + (chunks - tiles) x (one L2 re-read)
  m.combine.per_chunk = w2_bytes / kL2RereadBytesPerNs;
  m.combine.per_tile = w2_bytes / kHbmBytesPerNs - m.combine.per_chunk;
  return m;
}

}  // namespace unimoe
