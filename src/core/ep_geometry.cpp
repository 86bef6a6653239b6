#include "core/ep_geometry.h"

#include <cstddef>
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

ExpertWeights slice_experts(const ExpertWeights& all, const MoEConfig& config, int first, int count) {
  const int e = config.routing.num_experts;
  if (config.experts.local_expert_offset != 0 || (config.experts.num_local_experts != -1 &&
                                                  config.experts.num_local_experts != e))
    throw Error("experts.num_local_experts", "slice_experts takes the whole model's config (every expert local)");
  if (first < 0 || first >= e) throw Error("first", "is " + str(first) + "; allowed: 0.." + str(e - 1));
  if (count < 1 || first + count > e)
    throw Error("count", "is " + str(count) + "; allowed: 1.." + str(e - first) + " from expert " + str(first));
  const QuantVariant q = config.experts.quant;
  const std::size_t g1 = config.gemm1_cols(), h = config.experts.hidden, i = config.experts.intermediate;
  const std::size_t n = std::size_t(first);
  // Bytes of one expert's w13 and w2, and of its block scales, per variant.
  std::size_t w13_bytes = g1 * h * 2, w2_bytes = h * i * 2;
  std::size_t w13_blocks = 0, w2_blocks = 0;  // scale bytes (4-bit) or floats (FP8Block128)
  switch (q) {
    case QuantVariant::BF16: break;
    case QuantVariant::FP8PerTensor:
    case QuantVariant::FP8Block128:
      w13_bytes = g1 * h;
      w2_bytes = h * i;
      break;
    case QuantVariant::MXFP4:
    case QuantVariant::NVFP4:
      w13_bytes = g1 * h / 2;
      w2_bytes = h * i / 2;
      w13_blocks = g1 * (h / (q == QuantVariant::MXFP4 ? 32 : 16));
      w2_blocks = h * (i / (q == QuantVariant::MXFP4 ? 32 : 16));
      break;
  }
  auto offset = [](const void* p, std::size_t bytes) -> const void* {
    return p ? static_cast<const char*>(p) + bytes : nullptr;
  };
  ExpertWeights s = all;
  s.w13 = offset(all.w13, n * w13_bytes);
  s.w2 = offset(all.w2, n * w2_bytes);
  if (all.b13) s.b13 = all.b13 + n * g1;
  if (all.b2) s.b2 = all.b2 + n * h;
  if (all.w13_block_scale) s.w13_block_scale = all.w13_block_scale + n * w13_blocks;
  if (all.w2_block_scale) s.w2_block_scale = all.w2_block_scale + n * w2_blocks;
  if (q == QuantVariant::FP8Block128) {
    const std::size_t g1_blocks = (g1 + 127) / 128, h_blocks = h / 128, i_blocks = (i + 127) / 128;
    if (all.w13_scale) s.w13_scale = all.w13_scale + n * g1_blocks * h_blocks;
    if (all.w2_scale) s.w2_scale = all.w2_scale + n * h_blocks * i_blocks;
  } else {
    // FP8PerTensor and NVFP4: one scale per expert and matrix.
    if (all.w13_scale) s.w13_scale = all.w13_scale + n;
    if (all.w2_scale) s.w2_scale = all.w2_scale + n;
  }
  return s;
}

}  // namespace unimoe
