#include "ref/ep.h"

#include <cstddef>

namespace unimoe::ref {

EPSlots ep_slots(const int32_t* ids, int num_tokens, int top_k, int num_experts, int world_size) {
  const int per_rank = num_experts / world_size;
  EPSlots s;
  s.slot.assign(std::size_t(num_tokens) * world_size, -1);
  s.counts.assign(world_size, 0);
  for (int t = 0; t < num_tokens; ++t) {
    for (int k = 0; k < top_k; ++k) {
      const int e = ids[std::size_t(t) * top_k + k];
      if (e < 0 || e >= num_experts) continue;
      int32_t& slot = s.slot[std::size_t(t) * world_size + e / per_rank];
      if (slot < 0) slot = s.counts[e / per_rank]++;
    }
  }
  return s;
}

std::vector<float> ep_forward(const MoEConfig& config, int world_size, const WeightSource& weights,
                              const float* x, const Routing& routing, int threads,
                              const ActivationScales& scales) {
  const int t = routing.num_tokens, h = config.experts.hidden;
  const EPSlots slots = ep_slots(routing.ids.data(), t, config.routing.top_k,
                                 config.routing.num_experts, world_size);
  std::vector<float> out(std::size_t(t) * h, 0.0f);
  for (int d = 0; d < world_size; ++d) {
    const EPGeometry g = plan_ep(config, 1, d, world_size);
    const int first = d * g.experts_per_rank;
    const WeightSource local = [&](int e) { return weights(first + e); };
    const std::vector<float> partial = moe_forward(g.local_config, local, x, routing, threads, scales);
    for (int r = 0; r < t; ++r) {
      if (slots.slot[std::size_t(r) * world_size + d] < 0) continue;
      for (int c = 0; c < h; ++c)
        out[std::size_t(r) * h + c] += round_bf16(partial[std::size_t(r) * h + c]);
    }
  }
  return out;
}

}  // namespace unimoe::ref
