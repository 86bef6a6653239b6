#include "core/tactics.h"

#include "unimoe/unimoe.h"

namespace unimoe {
namespace {

struct NamedSm90Tactic {
  Sm90GemmTactic tactic;
  const char* name;
};
// The names say schedule and BLK_M x BLK_N x BLK_K, as the kernels' files do.
constexpr NamedSm90Tactic kSm90Names[] = {
    {Sm90GemmTactic::Cooperative128x128, "coop_128x128x64"},
    {Sm90GemmTactic::Cooperative128x256, "coop_128x256x64"},
    {Sm90GemmTactic::Pingpong64x128, "pingpong_64x128x64"},
};
static_assert(sizeof(kSm90Names) / sizeof(kSm90Names[0]) == kNumSm90GemmTactics,
              "every compiled sm90 tactic needs a name");

}  // namespace

std::string GemmTactic::to_string() const {
  if (stream) return "stream_m" + std::to_string(tile_m);
  const std::string tile = (wgmma ? "wg_m" : "m") + std::to_string(tile_m) + "n" + std::to_string(tile_n);
  return ctas_per_sm == 0 ? tile : tile + "x" + std::to_string(ctas_per_sm);
}

GemmTactic parse_gemm_tactic(const std::string& s) {
  std::string allowed;
  for (const GemmTactic& t : kMmaTactics) {
    if (s == t.to_string()) return t;
    allowed += (allowed.empty() ? "" : ", ") + t.to_string();
  }
  throw Error("mma_tactic", "'" + s + "' is not a compiled mma tactic; allowed: " + allowed);
}

std::string to_string(Sm90GemmTactic t) {
  for (const NamedSm90Tactic& named : kSm90Names)
    if (named.tactic == t) return named.name;
  return "<invalid " + std::to_string(static_cast<int>(t)) + ">";
}

Sm90GemmTactic parse_sm90_gemm_tactic(const std::string& s) {
  std::string allowed;
  for (const NamedSm90Tactic& named : kSm90Names) {
    if (s == named.name) return named.tactic;
    allowed += (allowed.empty() ? "" : ", ") + std::string(named.name);
  }
  throw Error("sm90_tactic", "unknown value '" + s + "'; allowed: " + allowed);
}

int stream_k_splits(int k, int n_out, bool gated, long long max_tiles, int sm_count,
                    int max_splits) {
  constexpr int kWarps = 8, kMinKPerWarp = 256, kCtasPerSm = 2;
  int splits = 1;
  while (splits < kWarps && splits < max_splits && k / (2 * splits) >= kMinKPerWarp) splits *= 2;
  if (splits == kWarps && max_splits >= kWarps && sm_count > 0) {
    const long long cols_per_cta = gated ? 8 : 16;  // one row group a CTA at 8 splits
    const long long ctas = max_tiles * ((n_out + cols_per_cta - 1) / cols_per_cta);
    const double waves = static_cast<double>(ctas) / (kCtasPerSm * sm_count);
    if (waves >= 1.5 && waves <= 6.0) splits = kWarps / 2;
  }
  return splits;
}

const char* to_string(Sm90Fp8GemmTactic t) {
  switch (t) {
    case Sm90Fp8GemmTactic::Cooperative128x128:
      return "fp8_coop_128x128x128";
    case Sm90Fp8GemmTactic::Pingpong64x128:
      return "fp8_pingpong_64x128x128";
    case Sm90Fp8GemmTactic::Cooperative128x128Cluster2x1:
      return "fp8_coop_128x128x128_c2x1";
  }
  return "<invalid fp8 tactic>";
}

Sm90Fp8GemmTactic parse_sm90_fp8_gemm_tactic(const std::string& s) {
  std::string allowed;
  for (Sm90Fp8GemmTactic t : kSm90Fp8GemmTactics) {
    if (s == to_string(t)) return t;
    allowed += (allowed.empty() ? "" : ", ") + std::string(to_string(t));
  }
  throw Error("fp8_tactic", "unknown value '" + s + "'; allowed: " + allowed);
}

}  // namespace unimoe
