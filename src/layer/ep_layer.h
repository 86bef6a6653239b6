// The expert-parallel layer behind include/unimoe/ep.h: the geometry
// (core/ep_geometry.h), the buffers of the fixed chunks, the local layer
// and the steps of a call. Internal: not installed.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "core/ep_geometry.h"
#include "dev/overrides.h"
#include "unimoe/ep.h"

namespace unimoe::ep_access {

// As EPLayer::create, with `dev` in place of the environment's overrides
// (the local layer plans with them).
std::unique_ptr<EPLayer> create(const MoEConfig& config, int max_tokens, EPTransport& transport,
                                const DevOverrides& dev);
// The same in the shared-scratch form of EPLayer::create.
std::unique_ptr<EPLayer> create(const MoEConfig& config, int max_tokens, EPTransport& transport,
                                const DevOverrides& dev, void* scratch, std::size_t scratch_size);

// The rank's geometry (chunk sizes, expert range) of a layer create made.
const EPGeometry& geometry(const EPLayer& layer);

// Device copies of the last dispatch's per-rank token counts ([W]) and
// slots ([max_tokens, W]), for tests.
const int32_t* dispatch_counts(const EPLayer& layer);
const int32_t* dispatch_slots(const EPLayer& layer);
// The routing the last dispatch computed from logits ([max_tokens, K] ids
// and weights; unset where the call gave its own), for comparisons.
const int32_t* routed_ids(const EPLayer& layer);
const float* routed_weights(const EPLayer& layer);

}  // namespace unimoe::ep_access
