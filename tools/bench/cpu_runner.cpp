// The CPU reference run, for machines without a GPU: the same shapes at a
// reduced size (H and I capped), T capped, CPU times. It shows the reference
// works end to end; its times say nothing about GPU speed.
#include <algorithm>
#include <chrono>

#include "bench.h"
#include "support/device_weights.h"
#include "ref/synthetic.h"
#include "ref/ref.h"

namespace unimoe::bench {
namespace {

using namespace unimoe::ref;

constexpr int kMaxHidden = 512;
constexpr int kMaxIntermediate = 256;
constexpr int kMaxTokens = 64;
// The H200 ceilings of bench/peers/h200-bf16-peers.json, so that the floor
// column shows what the reduced layer would cost on that GPU; the e4m3 rate
// is the one bench/peers/h100-peers.json measured on an H100, whose SMs and
// clocks the H200 shares.
constexpr Ceilings kReferenceCeilings{4.225, 677.7, 1333.6};

int reduce(int v, int cap, int multiple) {
  return v <= cap ? v : std::max(multiple, cap / multiple * multiple);
}

template <typename Fn>
double time_us(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

RunResult run_cpu_reference(const Options& opt, const std::string& why) {
  RunResult result;
  result.mode = "cpu-reference";
  result.device = "cpu";
  result.ceilings = kReferenceCeilings;
  result.note = "No GPU (" + why + "): ran the CPU reference at a reduced size (H <= " +
                std::to_string(kMaxHidden) + ", I <= " + std::to_string(kMaxIntermediate) +
                ", T <= " + std::to_string(kMaxTokens) +
                "). Times are CPU times; floors are for the reduced layer on an H200.";
  for (const Preset& shape : opt.shapes) {
    MoEConfig c = shape.config;
    if (!opt.logits_type.empty()) c.routing.logits_type = parse_logits_type(opt.logits_type);
    const QuantVariant q = c.experts.quant;
    const int mult = std::max(hidden_multiple(q), intermediate_multiple(q));
    c.experts.hidden = reduce(c.experts.hidden, kMaxHidden, mult);
    c.experts.intermediate = reduce(c.experts.intermediate, kMaxIntermediate, mult);
    validate(c);
    const Seeds seeds = seeds_for(0x5eed);
    HostWeights weights(c, seeds);
    const std::vector<float> bias = host_bias(c, seeds);
    for (int t : opt.tokens) {
      if (t > kMaxTokens) continue;
      // Input set 0 of the GPU run and the autotuner, logits as the config's
      // type gives them.
      const SyntheticInputs in = synthetic_inputs(c, t, seeds, 0, opt.routing);
      const std::vector<float>& logits = in.logits.values;
      const std::vector<float> x = host_x(c, t, in.x_seed);
      ref::Routing routing;
      ref::Permutation perm;
      std::vector<float> out;
      Point p;
      p.preset = shape.name;
      p.backend = "cpu-reference";
      p.config = c.to_string();
      p.tokens = t;
      p.stage_us.emplace_back("routing", time_us([&] {
        routing = ref::route(c.routing, logits.data(), t, c.routing.has_bias ? bias.data() : nullptr);
      }));
      p.stage_us.emplace_back("permute", time_us([&] {
        perm = ref::permute(routing.ids.data(), t, c.routing.top_k,
                            c.experts.local_expert_offset, c.local_experts());
      }));
      // Weights are generated on first use: do it outside the timed region.
      for (int id : routing.ids) {
        const int local = id - c.experts.local_expert_offset;
        if (local >= 0 && local < c.local_experts()) weights.view(local);
      }
      p.stage_us.emplace_back("experts", time_us([&] {
        out = ref::moe_forward(c, weights.source(), x.data(), routing, 0,
                               opt.static_scales ? ref::ActivationScales{kStaticXScale, kStaticActScale}
                                                 : ref::ActivationScales{});
      }));
      for (const auto& s : p.stage_us) p.time_us += s.second;
      p.active_experts = static_cast<double>(
          std::count_if(perm.expert_counts.begin(), perm.expert_counts.end(), [](int n) { return n > 0; }));
      p.floor = layer_floor(c, t, p.active_experts, result.ceilings);
      result.points.push_back(p);
    }
  }
  return result;
}

}  // namespace unimoe::bench
