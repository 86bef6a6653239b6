// The shape of one rank of an expert-parallel group (include/unimoe/ep.h):
// its expert range, the local layer's config and the sizes of the fixed
// chunks it exchanges. Host only, tested on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "unimoe/unimoe.h"

namespace unimoe {

struct EPGeometry {
  int rank = 0;
  int world_size = 1;        // W
  int max_tokens = 0;        // per rank and call: rows of each chunk
  int num_experts = 0;       // E
  int experts_per_rank = 0;  // E / W
  int top_k = 0;
  int hidden = 0;
  // The local layer: the model's config with this rank's expert range.
  MoEConfig local_config;

  // Tokens the local layer sees a call: W chunks of max_tokens rows.
  int local_tokens() const { return world_size * max_tokens; }
  // The rank that holds expert e, or -1 for an id outside [0, E).
  int rank_of_expert(int e) const { return e >= 0 && e < num_experts ? e / experts_per_rank : -1; }

  std::size_t x_chunk_bytes() const { return std::size_t(max_tokens) * hidden * 2; }
  std::size_t ids_chunk_bytes() const { return std::size_t(max_tokens) * top_k * 4; }
  std::size_t weights_chunk_bytes() const { return ids_chunk_bytes(); }
  // Bytes sent to the other W - 1 ranks a call: dispatch (x, ids, weights)
  // and return (the partial sums, bf16 rows like x).
  std::size_t bytes_sent_per_call() const {
    return std::size_t(world_size - 1) *
           (2 * x_chunk_bytes() + ids_chunk_bytes() + weights_chunk_bytes());
  }
};

// Validates the group and the config for EP (Error naming the field:
// "ep.world_size", "ep.rank", "ep.max_tokens", "routing.num_experts",
// "experts.local_expert_offset", "experts.num_local_experts", or the
// config's own fields) and returns the rank's geometry.
EPGeometry plan_ep(const MoEConfig& config, int max_tokens, int rank, int world_size);

}  // namespace unimoe
