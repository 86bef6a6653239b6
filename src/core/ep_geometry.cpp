#include "core/ep_geometry.h"

#include <string>

#include "unimoe/ep.h"

namespace unimoe {

namespace {
std::string str(long long v) { return std::to_string(v); }
}  // namespace

EPGeometry plan_ep(const MoEConfig& config, int max_tokens, int rank, int world_size) {
  if (world_size < 1 || world_size > EPLayer::kMaxWorldSize)
    throw Error("ep.world_size", "is " + str(world_size) + "; allowed: 1.." + str(EPLayer::kMaxWorldSize));
  if (rank < 0 || rank >= world_size)
    throw Error("ep.rank", "is " + str(rank) + "; allowed: 0.." + str(world_size - 1));
  if (max_tokens < 1) throw Error("ep.max_tokens", "is " + str(max_tokens) + "; allowed: >= 1");
  // Rank r's range is set here: a range in the config would be ambiguous.
  if (config.experts.local_expert_offset != 0)
    throw Error("experts.local_expert_offset",
                "is " + str(config.experts.local_expert_offset) +
                    "; the EP layer sets each rank's expert range: leave it 0");
  if (config.experts.num_local_experts != -1)
    throw Error("experts.num_local_experts",
                "is " + str(config.experts.num_local_experts) +
                    "; the EP layer sets each rank's expert range: leave it -1");
  validate(config);
  const int e = config.routing.num_experts;
  if (e % world_size != 0)
    throw Error("routing.num_experts", "is " + str(e) + "; expert parallelism over " + str(world_size) +
                                           " ranks needs a multiple of " + str(world_size));
  // The local layer sees W * max_tokens tokens a call.
  const long long local_tokens = 1LL * world_size * max_tokens;
  if (local_tokens * config.routing.top_k > (1LL << 30))
    throw Error("ep.max_tokens", "is " + str(max_tokens) + "; world_size * max_tokens * top_k (" +
                                     str(local_tokens * config.routing.top_k) +
                                     ") must stay within 2^30 rows");
  EPGeometry g;
  g.rank = rank;
  g.world_size = world_size;
  g.max_tokens = max_tokens;
  g.num_experts = e;
  g.experts_per_rank = e / world_size;
  g.top_k = config.routing.top_k;
  g.hidden = config.experts.hidden;
  g.local_config = config;
  g.local_config.experts.local_expert_offset = rank * g.experts_per_rank;
  g.local_config.experts.num_local_experts = g.experts_per_rank;
  validate(g.local_config);
  return g;
}

}  // namespace unimoe
