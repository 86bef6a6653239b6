// What unimoe-bench and the tests reach beyond the public MoELayer: a layer
// made with given development overrides, one stage of its forward alone
// (for per-stage timing), its plan and its routing result. Internal: not
// installed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "dev/overrides.h"
#include "layer/moe_layer.h"
#include "unimoe/unimoe.h"

namespace unimoe::layer_access {

// As MoELayer::create, with `dev` in place of the environment's overrides;
// with a scratch, as MoELayer::create's shared-scratch form.
std::unique_ptr<MoELayer> create(const MoEConfig& config, int max_tokens, const DevOverrides& dev);
std::unique_ptr<MoELayer> create(const MoEConfig& config, int max_tokens, const DevOverrides& dev,
                                 void* scratch, std::size_t scratch_size);

// The implementation behind a layer that create or MoELayer::create made.
MoELayerImpl& impl(MoELayer& layer);
const MoELayerImpl& impl(const MoELayer& layer);

}  // namespace unimoe::layer_access
