// The permutation (expanded rows -> expert order) and the GEMM tile schedule,
// written as plainly as possible: the kernels' sort and tile lists are
// compared against these element by element.
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "ref/ref.h"

namespace unimoe::ref {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

Permutation permute(const int32_t* ids, int num_tokens, int top_k, int local_offset,
                    int num_local) {
  require(num_tokens >= 0, "permute: num_tokens is " + str(num_tokens) + "; must be >= 0");
  require(top_k > 0, "permute: top_k is " + str(top_k) + "; must be > 0");
  require(local_offset >= 0, "permute: local_offset is " + str(local_offset) + "; must be >= 0");
  require(num_local >= 0, "permute: num_local is " + str(num_local) + "; must be >= 0");
  const int64_t expanded = static_cast<int64_t>(num_tokens) * top_k;
  // Permuted and expanded indices are int32 on the device too.
  require(expanded <= std::numeric_limits<int32_t>::max(),
          "permute: num_tokens * top_k = " + str(expanded) + " exceeds int32");
  require(expanded == 0 || ids != nullptr, "permute: ids is null");

  Permutation p;
  p.expert_counts.assign(num_local, 0);
  p.expanded_to_permuted.assign(expanded, -1);
  // Any id outside [local_offset, local_offset + num_local) is off this rank,
  // -1 and ids >= E included: precomputed routing may hold any int32
  // (docs/design.md, "Inputs outside the usual range"). Compared before the
  // subtraction, which could overflow.
  const int64_t local_end = static_cast<int64_t>(local_offset) + num_local;
  for (int64_t i = 0; i < expanded; ++i)
    if (ids[i] >= local_offset && ids[i] < local_end) ++p.expert_counts[ids[i] - local_offset];

  p.expert_offsets.assign(num_local + 1, 0);
  for (int e = 0; e < num_local; ++e)
    p.expert_offsets[e + 1] = p.expert_offsets[e] + p.expert_counts[e];
  p.permuted_to_expanded.resize(p.expert_offsets[num_local]);

  // Visiting expanded rows in increasing order makes the sort stable.
  std::vector<int32_t> cursor(p.expert_offsets.begin(), p.expert_offsets.end() - 1);
  for (int64_t i = 0; i < expanded; ++i) {
    if (ids[i] < local_offset || ids[i] >= local_end) continue;
    const int32_t row = cursor[ids[i] - local_offset]++;
    p.permuted_to_expanded[row] = static_cast<int32_t>(i);
    p.expanded_to_permuted[i] = row;
  }
  return p;
}

std::vector<Tile> make_tiles(const Permutation& perm, int tile_m) {
  require(tile_m > 0, "make_tiles: tile_m is " + str(tile_m) + "; must be > 0");
  require(perm.expert_offsets.size() == perm.expert_counts.size() + 1,
          "make_tiles: expert_offsets must hold expert_counts.size() + 1 entries");
  const int num_local = static_cast<int>(perm.expert_counts.size());

  std::vector<Tile> tiles;
  for (int e = 0; e < num_local; ++e) {
    const int32_t begin = perm.expert_offsets[e];
    const int32_t end = begin + perm.expert_counts[e];
    for (int32_t row = begin; row < end; row += tile_m)
      tiles.push_back(Tile{e, row, std::min<int32_t>(tile_m, end - row)});
  }
  return tiles;
}

}  // namespace unimoe::ref
