// The CPU reference of the expert-parallel layer (include/unimoe/ep.h): which
// chunk slot each token takes on each rank, and the output the combine forms.
#pragma once

#include <cstdint>
#include <vector>

#include "core/ep_geometry.h"
#include "ref/ref.h"

namespace unimoe::ref {

// Where dispatch puts each token: slot[t * W + d] is token t's row in the
// chunk for rank d, or -1 where none of its K ids is on d (an id outside
// [0, E) is on no rank). Rows are given in token order, so slot is the
// number of earlier tokens sent to d; counts[d] the tokens sent to d.
struct EPSlots {
  std::vector<int32_t> slot;    // [T, W]
  std::vector<int32_t> counts;  // [W]
};
EPSlots ep_slots(const int32_t* ids, int num_tokens, int top_k, int num_experts, int world_size);

// The EP layer's output for `routing`: rank d's partial sum (moe_forward
// over d's experts) rounded to bf16, as the return step carries it, then
// the partial sums of the ranks a token reached added in rank order in fp32
// (not rounded). `weights`: the model's experts by global index (a source
// for config with every expert local). A token whose experts are all on
// one rank gets round_bf16 of moe_forward's value. scales: FP8PerTensor's
// static activation scales, as for moe_forward.
std::vector<float> ep_forward(const MoEConfig& config, int world_size, const WeightSource& weights,
                              const float* x, const Routing& routing, int threads = 0,
                              const ActivationScales& scales = {});

}  // namespace unimoe::ref
