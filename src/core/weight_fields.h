// Which fields of ExpertWeights a config's quant variant needs and which it
// refuses: the one rule MoELayer::set_weights and the C ABI's CPU
// reference (unimoe_ref_forward) both apply.
#pragma once

#include "unimoe/unimoe.h"

namespace unimoe {

// Throws Error naming the field: a scale the variant needs and lacks
// (w13_scale / w2_scale for the FP8 variants and NVFP4, the block scales
// for MXFP4 and NVFP4), one it has no use for, w13_interleaved off MXFP4
// and NVFP4 or without gate rows, a static activation scale off
// FP8PerTensor. Pointers are checked for presence only, not alignment.
void check_quant_weight_fields(const MoEConfig& config, const ExpertWeights& w);

}  // namespace unimoe
