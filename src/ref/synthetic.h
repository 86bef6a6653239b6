// Synthetic inputs that the host and the device agree on: routing logits,
// and counter-based values of x and the weights (core/hash_random.h), so
// that the host regenerates any slice the device filled (kernels/fill.cuh)
// without copying it back. Used by the benchmark and the GPU tests.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ref/ref.h"
#include "unimoe/unimoe.h"

namespace unimoe::ref {

// Seeds of the tensors of one input set or one layer's weights.
struct Seeds {
  uint64_t x, w13, w2, b13, b2, bias;
};
Seeds seeds_for(uint64_t base);

// Scales keep activations O(1) through both GEMMs.
float w13_scale(const MoEConfig& c);
float w2_scale(const MoEConfig& c);
inline constexpr float kBiasScale = 0.1f;
// The DeepSeek score bias: small against the spread of sigmoid scores, as a
// load-balancing bias is, so it does not pin every token to the same groups.
inline constexpr float kRoutingBiasScale = 0.01f;
inline constexpr float kXScale = 1.0f;

// The routing distributions of the synthetic logits, by name:
//   "uniform"  every expert equally likely;
//   "skewed"   a mild preference for low expert ids (1.5 log(1 + id) off
//              each logit);
//   "zipf:S"   each token's K experts drawn without replacement, expert of
//              popularity rank r (a fixed order of the E experts) with
//              weight 1 / (r + 1)^S, S > 0;
//   "hot:P"    one fixed expert is among the first choices of a fraction P
//              (0 < P <= 1) of the tokens, the rest uniform.
// The drawn experts' logits are raised by kChosenMargin, so every top-K
// policy picks them (grouped policies keep their group limit on top).
// Throws Error naming `field` for any other text.
void check_routing_distribution(const std::string& name, const std::string& field);
inline constexpr float kChosenMargin = 16.0f;

// The expert that "hot:P" favours and the popularity order "zipf:S" uses
// (rank -> expert id): fixed for a given E, the same for every input set.
int hot_expert(int num_experts);
std::vector<int> popularity_order(int num_experts);

// logits [T, E]: mean 0, standard deviation 1 (the sum of three uniform
// draws), like a trained router's, shaped by the routing distribution
// (check_routing_distribution's names; an unknown name throws).
std::vector<float> make_logits(const MoEConfig& c, int num_tokens, uint64_t seed,
                               const std::string& routing);

// Logits [T, E] as uploaded for `type`: the bytes for the device (fp32, or
// bf16 rounded to nearest even) and the values the device reads, which the
// reference must route on.
struct DeviceLogits {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};
DeviceLogits device_logits(const std::vector<float>& logits, LogitsType type);

// Input set `set` (0, 1, ...) of a call of T tokens: what the benchmark's
// GPU and CPU runs and the autotuner feed the layer, built here once so that
// they cannot drift apart. x is filled on the device by
// launch_fill_bf16(x, T * H, x_seed, kXScale) (kernels/common/fill.cuh) and
// regenerated on the host by host_x(c, rows, x_seed); the logits come in the
// config's logits type, with the values the device reads.
struct SyntheticInputs {
  uint64_t x_seed = 0;
  DeviceLogits logits;
};
SyntheticInputs synthetic_inputs(const MoEConfig& c, int num_tokens, const Seeds& s, int set,
                                 const std::string& routing);

// Host copies of x rows [0, num_tokens) as bf16-rounded floats: of the fill
// with seed x_seed, or (Seeds) of input set 0.
std::vector<float> host_x(const MoEConfig& c, int num_tokens, uint64_t x_seed);
std::vector<float> host_x(const MoEConfig& c, int num_tokens, const Seeds& s);
// Rows `rows` of that fill with seed x_seed, in the order given.
std::vector<float> host_x_rows(const MoEConfig& c, const std::vector<int>& rows, uint64_t x_seed);
std::vector<float> host_bias(const MoEConfig& c, const Seeds& s);

// A WeightSource regenerating (and caching) each hit expert's weights: the
// bf16 values launch_fill_bf16(seeds.w13, w13_scale(c)) and (seeds.w2,
// w2_scale(c)) write for the whole [E_local, rows, cols] arrays, and the
// biases of launch_fill_f32(seeds.b13 / b2, kBiasScale). For every variant
// but BF16 each expert's matrix is dequantize(quantize(quant, its bf16
// values)): what the device weights quantized from the same values
// (kernels/quant/fp8_weights.cuh, fp4_weights.cuh) mean.
class HostWeights {
 public:
  HostWeights(const MoEConfig& c, const Seeds& s) : c_(c), s_(s) {}
  ref::ExpertView view(int local_expert);
  ref::WeightSource source() {
    return [this](int e) { return view(e); };
  }

 private:
  struct Expert {
    std::vector<float> w13, w2, b13, b2;
    ref::ExpertView view() const {
      return {w13.data(), w2.data(), b13.empty() ? nullptr : b13.data(),
              b2.empty() ? nullptr : b2.data()};
    }
  };
  MoEConfig c_;
  Seeds s_;
  std::mutex mu_;
  std::unordered_map<int, Expert> cache_;
};

}  // namespace unimoe::ref
