// The per-token routing math on the device, shared by the routing kernel
// (routing.cu) and the fused routing + permute kernel (fused_routing.cu), so
// that both give the same ids and weights bit for bit. Formulas:
// docs/routing.md; contract: routing.cuh.
//
// One warp routes one token: each lane holds kPerLane experts in registers
// (Slots: strided or in runs), and K rounds of a warp argmax pick the
// experts, best first. Keys are floats mapped to order-preserving uint32, so
// one max-reduce finds the best key, and among the slots that hold it the
// lowest expert wins: ties go to the lower expert, as in the reference. Key 0
// lies below every float (-inf included) and marks experts already chosen,
// masked by the group stage, or past E.
// Weights are computed in double from the fp32 logits, as the reference does
// (only the all-expert softmax sum of Default and RenormalizeNaive adds fp32
// terms), so they agree with it within a few fp32 ulps.
//
// The parts, in this order: keys (limits, loads, keys, scores, slots),
// groups (DeepSeek's group stage), weights, slots (a token's state and slot
// loads), rounds and threshold (the selection algorithms), choose (one
// token routed by one warp), host (checks and kernel params).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/exact_quotient.h"
#include "core/group_index.h"
#include "core/routing_launch_shape.h"
#include "core/sigmoid_fp32.h"
#include "kernels/common/common.cuh"
#include "kernels/routing/routing.cuh"

#include "kernels/routing/routing_keys.cuh"
#include "kernels/routing/routing_groups.cuh"
#include "kernels/routing/routing_weights.cuh"
#include "kernels/routing/routing_slots.cuh"
#include "kernels/routing/routing_rounds.cuh"
#include "kernels/routing/routing_threshold.cuh"
#include "kernels/routing/routing_choose.cuh"
#include "kernels/routing/routing_host.cuh"
