// unimoe_ref_forward: the CPU reference (ref::moe_forward) on host memory
// laid out as the GPU layer's inputs, for the Python package's CPU path.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "capi/capi_status.h"
#include "core/weight_fields.h"
#include "ref/ref.h"

namespace unimoe::capi {
namespace {

bool is_fp8(QuantVariant q) {
  return q == QuantVariant::FP8Block128 || q == QuantVariant::FP8PerTensor;
}

bool is_fp4(QuantVariant q) { return q == QuantVariant::MXFP4 || q == QuantVariant::NVFP4; }

// The weight fields the config's variant needs and allows, as
// MoELayer::set_weights checks them.
void check_weights(const MoEConfig& c, const unimoe_weights& w) {
  require_pointer(w.w13, "weights.w13");
  require_pointer(w.w2, "weights.w2");
  if (c.experts.has_bias) {
    require_pointer(w.b13, "weights.b13");
    require_pointer(w.b2, "weights.b2");
  }
  check_quant_weight_fields(c, to_weights(w));
}

// One matrix [rows, cols] of expert e as floats: bf16 values, or e4m3 codes
// times the scale of their 128 x 128 block (FP8Block128, scales
// [rows / 128, cols / 128] per expert) or of the whole matrix (FP8PerTensor,
// one scale per expert).
std::vector<float> expert_matrix(QuantVariant q, const void* data, const float* scales, int e,
                                 int rows, int cols) {
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  std::vector<float> v(n);
  if (!is_fp8(q)) {
    const uint16_t* bits = static_cast<const uint16_t*>(data) + e * n;
    for (std::size_t j = 0; j < n; ++j) v[j] = ref::bf16_to_f32(bits[j]);
    return v;
  }
  const uint8_t* codes = static_cast<const uint8_t*>(data) + e * n;
  const bool block = q == QuantVariant::FP8Block128;
  const int block_rows = (rows + 127) / 128, block_cols = (cols + 127) / 128;
  const float* s = scales + (block ? static_cast<std::size_t>(e) * block_rows * block_cols : e);
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t r = j / cols, c = j % cols;
    v[j] = ref::e4m3_to_f32(codes[j]) * (block ? s[(r / 128) * block_cols + c / 128] : s[0]);
  }
  return v;
}

// Row r of an interleaved [rows] (gate, up, gate, up, ...) in gate-then-up
// order: even rows to the first half, odd rows to the second.
int gate_up_row(int r, int rows) { return r % 2 == 0 ? r / 2 : rows / 2 + r / 2; }

// One 4-bit matrix [rows, cols] of expert e as floats, exactly as
// ref::dequantize gives them: packed e2m1 codes [rows, cols / 2] bytes,
// block scale bytes [rows, cols / block] (MXFP4 e8m0 per 32, NVFP4 e4m3
// per 16) and NVFP4's matrix scale global_scales[e]. interleaved: the rows
// alternate gate and up; the result is in gate-then-up order.
std::vector<float> expert_fp4_matrix(QuantVariant q, const void* data,
                                     const uint8_t* block_scales, const float* global_scales,
                                     int e, int rows, int cols, bool interleaved) {
  const std::size_t bytes = static_cast<std::size_t>(rows) * cols / 2;
  const std::size_t scale_bytes =
      static_cast<std::size_t>(rows) * (cols / (q == QuantVariant::MXFP4 ? 32 : 16));
  ref::QuantMatrix m;
  m.variant = q;
  m.rows = rows;
  m.cols = cols;
  const uint8_t* codes = static_cast<const uint8_t*>(data) + e * bytes;
  m.data.assign(codes, codes + bytes);
  const uint8_t* scales = block_scales + e * scale_bytes;
  m.block_scales.assign(scales, scales + scale_bytes);
  if (q == QuantVariant::NVFP4) m.global_scale = global_scales[e];
  std::vector<float> v = ref::dequantize(m);
  if (!interleaved) return v;
  std::vector<float> ordered(v.size());
  for (int r = 0; r < rows; ++r)
    std::copy(v.begin() + static_cast<std::ptrdiff_t>(r) * cols,
              v.begin() + static_cast<std::ptrdiff_t>(r + 1) * cols,
              ordered.begin() + static_cast<std::ptrdiff_t>(gate_up_row(r, rows)) * cols);
  return ordered;
}

// The host weights as the reference's WeightSource: the reference asks for
// each hit expert once, from its worker threads, so each slot is written by
// one thread only.
class HostWeights {
 public:
  HostWeights(const MoEConfig& c, const unimoe_weights& w)
      : c_(c), w_(w), experts_(static_cast<std::size_t>(c.local_experts())) {}

  ref::WeightSource source() {
    return [this](int e) { return view(e); };
  }

 private:
  struct Expert {
    std::vector<float> w13, w2, b13;
  };

  ref::ExpertView view(int e) {
    const int h = c_.experts.hidden, i = c_.experts.intermediate, n1 = c_.gemm1_cols();
    const QuantVariant q = c_.experts.quant;
    Expert& x = experts_[e];
    const bool interleaved = w_.w13_interleaved != 0;
    if (is_fp4(q)) {  // w13 [gemm1_cols, H] gate rows then up rows, w2 [H, I]
      x.w13 = expert_fp4_matrix(q, w_.w13, w_.w13_block_scale, w_.w13_scale, e, n1, h,
                                interleaved);
      x.w2 = expert_fp4_matrix(q, w_.w2, w_.w2_block_scale, w_.w2_scale, e, h, i, false);
    } else {
      x.w13 = expert_matrix(q, w_.w13, w_.w13_scale, e, n1, h);  // [gemm1_cols, H]
      x.w2 = expert_matrix(q, w_.w2, w_.w2_scale, e, h, i);      // [H, I]
    }
    ref::ExpertView v{x.w13.data(), x.w2.data(), nullptr, nullptr};
    if (c_.experts.has_bias) {
      v.b13 = w_.b13 + static_cast<std::size_t>(e) * n1;  // [gemm1_cols]
      if (interleaved) {
        x.b13.resize(n1);
        for (int r = 0; r < n1; ++r) x.b13[gate_up_row(r, n1)] = v.b13[r];
        v.b13 = x.b13.data();
      }
      v.b2 = w_.b2 + static_cast<std::size_t>(e) * h;  // [H]
    }
    return v;
  }

  MoEConfig c_;
  unimoe_weights w_;
  std::vector<Expert> experts_;
};

std::vector<float> bf16_values(const void* data, std::size_t n) {
  const uint16_t* bits = static_cast<const uint16_t*>(data);
  std::vector<float> v(n);
  for (std::size_t j = 0; j < n; ++j) v[j] = ref::bf16_to_f32(bits[j]);
  return v;
}

// The routing of the call: precomputed ids and weights when both are given,
// else ref::route on the logits (bf16 logits widened exactly to fp32).
ref::Routing call_routing(const MoEConfig& c, int t, const void* logits, const float* bias,
                          const int32_t* ids, const float* weights) {
  const int e = c.routing.num_experts, k = c.routing.top_k;
  if ((ids == nullptr) != (weights == nullptr))
    throw Error("args", "precomputed routing needs both topk_ids and topk_weights");
  if (ids) {
    ref::Routing r;
    r.num_tokens = t;
    r.top_k = k;
    r.ids.assign(ids, ids + static_cast<std::size_t>(t) * k);
    r.weights.assign(weights, weights + static_cast<std::size_t>(t) * k);
    return r;
  }
  if (!logits) throw Error("args", "logits must be set (or topk_ids and topk_weights)");
  if (c.routing.has_bias && !bias)
    throw Error("routing_bias", "the config has a routing bias (has_bias): pass it");
  const std::size_t n = static_cast<std::size_t>(t) * e;
  std::vector<float> l = c.routing.logits_type == LogitsType::BF16
                             ? bf16_values(logits, n)
                             : std::vector<float>(static_cast<const float*>(logits),
                                                  static_cast<const float*>(logits) + n);
  return ref::route(c.routing, l.data(), t, c.routing.has_bias ? bias : nullptr);
}

}  // namespace
}  // namespace unimoe::capi

extern "C" int unimoe_ref_forward(const char* config_text, int num_tokens, const void* x,
                                  const void* logits, const float* routing_bias,
                                  const int32_t* topk_ids, const float* topk_weights,
                                  const unimoe_weights* weights, void* out, int threads) {
  using namespace unimoe;
  return capi::guarded([&] {
    capi::require_pointer(config_text, "config");
    const MoEConfig c = MoEConfig::parse(config_text);
    validate(c);
    if (num_tokens < 0) throw Error("num_tokens", "is " + std::to_string(num_tokens));
    capi::require_pointer(weights, "weights");
    capi::check_weights(c, *weights);
    if (num_tokens == 0) return;
    capi::require_pointer(x, "args.x");
    capi::require_pointer(out, "args.out");
    const int h = c.experts.hidden;
    const ref::Routing routing =
        capi::call_routing(c, num_tokens, logits, routing_bias, topk_ids, topk_weights);
    const std::vector<float> xf = capi::bf16_values(x, static_cast<std::size_t>(num_tokens) * h);
    ref::ActivationScales scales;
    if (weights->x_scale) scales.x = *weights->x_scale;
    if (weights->act_scale) scales.act = *weights->act_scale;
    capi::HostWeights source(c, *weights);
    const std::vector<float> y =
        ref::moe_forward(c, source.source(), xf.data(), routing, threads, scales);
    uint16_t* o = static_cast<uint16_t*>(out);
    for (std::size_t j = 0; j < y.size(); ++j) o[j] = ref::f32_to_bf16(y[j]);
  });
}
