// MoELayer::autotune: for each token bucket asked for, the winner saved in
// the tuning cache, or else every candidate of candidates_for checked against
// the CPU reference on the layer's own weights and timed by CUDA-graph replay
// on synthetic inputs (plan/autotune.h has the host half, plan/tuning.h the
// Tuner). Host code: it launches only the layer's forward and fills.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/common/common.cuh"
#include "kernels/common/fill.cuh"
#include "layer/graph_timing.h"
#include "layer/moe_layer.h"
#include "plan/autotune.h"
#include "plan/tuning.h"
#include "ref/ref.h"
#include "ref/synthetic.h"

namespace unimoe {
namespace {

// Seeds of the synthetic inputs (x, logits, routing bias) autotune times on.
constexpr uint64_t kAutotuneSeed = 0xa070;

std::vector<float> download_bf16(const void* base, std::size_t offset, std::size_t n) {
  std::vector<uint16_t> bits(n);
  UNIMOE_CUDA_CHECK(cudaMemcpy(bits.data(), static_cast<const uint16_t*>(base) + offset, n * 2,
                               cudaMemcpyDeviceToHost));
  std::vector<float> values(n);
  for (std::size_t j = 0; j < n; ++j) values[j] = ref::bf16_to_f32(bits[j]);
  return values;
}

std::vector<float> download_f32(const float* base, std::size_t offset, std::size_t n) {
  std::vector<float> values(n);
  UNIMOE_CUDA_CHECK(cudaMemcpy(values.data(), base + offset, n * 4, cudaMemcpyDeviceToHost));
  return values;
}

// The values of one expert's FP8 matrix [rows, cols] at `offset` codes into
// `codes`: e4m3 value times the scale of its 128 x 128 block (scales
// [rows / 128, cols / 128] at `scales`, FP8Block128) or of the matrix (one
// float at `scales`, FP8PerTensor), as the layer's GEMMs read them.
std::vector<float> download_fp8(QuantVariant q, const void* codes, std::size_t offset,
                                const float* scales, int rows, int cols) {
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  std::vector<uint8_t> bits(n);
  UNIMOE_CUDA_CHECK(cudaMemcpy(bits.data(), static_cast<const uint8_t*>(codes) + offset, n,
                               cudaMemcpyDeviceToHost));
  const int block_cols = cols / 128;
  const std::vector<float> s = download_f32(
      scales, 0, q == QuantVariant::FP8Block128 ? static_cast<std::size_t>(rows / 128) * block_cols : 1);
  std::vector<float> values(n);
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t r = j / cols, c = j % cols;
    const float scale = s.size() == 1 ? s[0] : s[(r / 128) * block_cols + c / 128];
    values[j] = ref::e4m3_to_f32(bits[j]) * scale;
  }
  return values;
}

// The values of one expert's 4-bit matrix [rows, cols] (MXFP4 or NVFP4):
// its packed codes at byte `offset` of `codes`, block scale bytes at
// `scale_offset` of `block_scales` and, for NVFP4, the matrix scale
// `global`, as ref::dequantize reads them. interleaved: the rows alternate
// gate and up (ExpertWeights::w13_interleaved); the result is in gate-then-
// up order, as the reference and the layer's prepared copy have them.
std::vector<float> download_fp4(QuantVariant q, const void* codes, std::size_t offset,
                                const uint8_t* block_scales, std::size_t scale_offset,
                                const float* global, int rows, int cols, bool interleaved) {
  ref::QuantMatrix m;
  m.variant = q;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(static_cast<std::size_t>(rows) * cols / 2);
  m.block_scales.resize(static_cast<std::size_t>(rows) * (cols / (q == QuantVariant::MXFP4 ? 32 : 16)));
  UNIMOE_CUDA_CHECK(cudaMemcpy(m.data.data(), static_cast<const uint8_t*>(codes) + offset,
                               m.data.size(), cudaMemcpyDeviceToHost));
  UNIMOE_CUDA_CHECK(cudaMemcpy(m.block_scales.data(), block_scales + scale_offset,
                               m.block_scales.size(), cudaMemcpyDeviceToHost));
  if (global != nullptr)
    UNIMOE_CUDA_CHECK(cudaMemcpy(&m.global_scale, global, 4, cudaMemcpyDeviceToHost));
  std::vector<float> values = ref::dequantize(m);
  if (!interleaved) return values;
  std::vector<float> ordered(values.size());
  const int half = rows / 2;
  for (int r = 0; r < rows; ++r) {
    const int to = r % 2 == 0 ? r / 2 : half + r / 2;
    std::copy(values.begin() + static_cast<std::ptrdiff_t>(r) * cols,
              values.begin() + static_cast<std::ptrdiff_t>(r + 1) * cols,
              ordered.begin() + static_cast<std::ptrdiff_t>(to) * cols);
  }
  return ordered;
}

// The layer's device weights as the reference's WeightSource: each local
// expert the reference asks for is downloaded once (bf16, or e4m3 codes and
// their scales, -> float) and kept for the life of this object, so the
// views stay valid. Thread-safe: the reference asks from its worker threads.
class DeviceWeightSource {
 public:
  DeviceWeightSource(const MoEConfig& c, const ExpertWeights& w) : c_(c), w_(w) {
    UNIMOE_CUDA_CHECK(cudaGetDevice(&device_));
  }

  ref::WeightSource source() {
    return [this](int local_expert) { return view(local_expert); };
  }

 private:
  struct Expert {
    std::vector<float> w13, w2, b13, b2;
  };

  ref::ExpertView view(int e) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(e);
    if (it == cache_.end()) {
      // A worker thread starts on device 0; the weights live on the layer's.
      UNIMOE_CUDA_CHECK(cudaSetDevice(device_));
      const std::size_t h = c_.experts.hidden, i = c_.experts.intermediate, n1 = c_.gemm1_cols();
      Expert x;
      const QuantVariant q = c_.experts.quant;
      if (q == QuantVariant::FP8Block128 || q == QuantVariant::FP8PerTensor) {
        const bool block = q == QuantVariant::FP8Block128;
        const std::size_t s13 = block ? (n1 / 128) * (h / 128) : 1, s2 = block ? (h / 128) * (i / 128) : 1;
        x.w13 = download_fp8(q, w_.w13, e * n1 * h, w_.w13_scale + e * s13, int(n1), int(h));
        x.w2 = download_fp8(q, w_.w2, e * h * i, w_.w2_scale + e * s2, int(h), int(i));
      } else if (q == QuantVariant::MXFP4 || q == QuantVariant::NVFP4) {
        const std::size_t block = q == QuantVariant::MXFP4 ? 32 : 16;
        const bool nv = q == QuantVariant::NVFP4;
        x.w13 = download_fp4(q, w_.w13, e * n1 * h / 2, w_.w13_block_scale, e * n1 * (h / block),
                             nv ? w_.w13_scale + e : nullptr, int(n1), int(h), w_.w13_interleaved);
        x.w2 = download_fp4(q, w_.w2, e * h * i / 2, w_.w2_block_scale, e * h * (i / block),
                            nv ? w_.w2_scale + e : nullptr, int(h), int(i), false);
      } else {
        x.w13 = download_bf16(w_.w13, e * n1 * h, n1 * h);  // [gemm1_cols, H]
        x.w2 = download_bf16(w_.w2, e * h * i, h * i);      // [H, I]
      }
      if (c_.experts.has_bias) {
        x.b13 = download_f32(w_.b13, e * n1, n1);  // [gemm1_cols]
        if (w_.w13_interleaved) {  // gate, up, gate, ... -> gate rows then up rows
          std::vector<float> ordered(n1);
          for (std::size_t r = 0; r < n1; ++r) ordered[r % 2 == 0 ? r / 2 : n1 / 2 + r / 2] = x.b13[r];
          x.b13 = std::move(ordered);
        }
        x.b2 = download_f32(w_.b2, e * h, h);      // [H]
      }
      it = cache_.emplace(e, std::move(x)).first;
    }
    const Expert& x = it->second;
    return {x.w13.data(), x.w2.data(), x.b13.empty() ? nullptr : x.b13.data(),
            x.b2.empty() ? nullptr : x.b2.data()};
  }

  MoEConfig c_;
  ExpertWeights w_;
  int device_ = 0;
  std::mutex mu_;
  std::unordered_map<int, Expert> cache_;
};

// A non-blocking stream destroyed on scope exit.
struct OwnStream {
  cudaStream_t s = nullptr;
  OwnStream() { UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~OwnStream() { cudaStreamDestroy(s); }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
};

// One input set of a bucket: x, logits and the output of one forward.
struct InputSet {
  std::unique_ptr<DeviceMem> x, logits, out;
  ForwardArgs args;
};

// What every bucket shares: the layer, the options, the synthetic routing
// bias (host and device copies) and the reference's weights.
struct AutotuneRun {
  MoELayerImpl& layer;
  const AutotuneOptions& options;
  ref::Seeds seeds;
  std::vector<float> host_routing_bias;
  std::unique_ptr<DeviceMem> routing_bias;
  DeviceWeightSource weights;
  ref::ActivationScales static_scales;  // FP8PerTensor's, when the weights carry them
  cudaStream_t stream;
};

// The winner of one bucket, left set in the layer. Throws
// std::runtime_error (from Tuner) when no candidate passes.
TuningChoice tune_bucket(AutotuneRun& run, const AutotuneTarget& target,
                         const Tuner::ProgressFn& progress) {
  MoELayerImpl& layer = run.layer;
  const MoEConfig& c = layer.config();
  const cudaStream_t stream = run.stream;
  const int t = target.num_tokens;
  const std::size_t h = c.experts.hidden;

  std::vector<InputSet> sets(kAutotuneInputSets);
  std::vector<float> set0_logits;  // as the device reads them
  for (int s = 0; s < kAutotuneInputSets; ++s) {
    InputSet& in = sets[s];
    const ref::SyntheticInputs synthetic = ref::synthetic_inputs(c, t, run.seeds, s, run.options.routing);
    const ref::DeviceLogits& logits = synthetic.logits;
    in.x = std::make_unique<DeviceMem>(t * h * 2);
    in.logits = std::make_unique<DeviceMem>(logits.bytes.size());
    in.out = std::make_unique<DeviceMem>(t * h * 2);
    launch_fill_bf16(in.x->as<uint16_t>(), t * h, synthetic.x_seed, ref::kXScale, stream);
    // From pageable memory: returns once `logits` is no longer needed.
    UNIMOE_CUDA_CHECK(cudaMemcpyAsync(in.logits->p, logits.bytes.data(), logits.bytes.size(),
                                      cudaMemcpyHostToDevice, stream));
    UNIMOE_CUDA_CHECK(cudaMemsetAsync(in.out->p, 0xff, t * h * 2, stream));
    in.args.num_tokens = t;
    in.args.x = in.x->p;
    in.args.logits = in.logits->p;
    in.args.routing_bias = run.routing_bias ? run.routing_bias->as<float>() : nullptr;
    in.args.out = in.out->p;
    if (s == 0) set0_logits = logits.values;
  }
  UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));

  // The reference output of set 0's first `check` tokens, routed on the
  // host from the same logits and bias the device reads.
  const int check = std::min(t, run.options.check_tokens);
  const ref::Routing routing = ref::route(c.routing, set0_logits.data(), check,
                                          run.routing_bias ? run.host_routing_bias.data() : nullptr);
  const std::vector<float> x = download_bf16(sets[0].x->p, 0, check * h);
  // FP8PerTensor's dynamic scales are one amax over all T tokens: the
  // reference of `check` tokens takes the ones a forward of set 0 computed.
  ref::ActivationScales scales = run.static_scales;
  if (c.experts.quant == QuantVariant::FP8PerTensor && scales.x == 0.0f) {
    layer.forward(sets[0].args, stream);
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    scales = layer.dynamic_activation_scales(t);
  }
  double allowance = 0.0;
  const std::vector<float> want =
      ref::moe_forward(c, run.weights.source(), x.data(), routing, 0, scales, &allowance);
  // FP8: an intermediate element at a near tie may round either way in a
  // candidate's summation order; the check allows the change that makes.
  const double tolerance =
      reference_tolerance(c.experts.quant) + ref::relative_flip_allowance(allowance, want);

  std::vector<ForwardArgs> args;
  for (const InputSet& in : sets) args.push_back(in.args);
  auto error_of_set0 = [&] { return forward_error(layer, sets[0].args, want, stream); };
  auto time_layer = [&] { return median_forward_us(layer, args, stream, run.options.iters); };

  const Tuner tuner(
      [&](const TuningChoice& choice) {
        layer.set_tuned(target.bucket, choice);
        return time_layer();
      },
      [&](const TuningChoice& choice, std::string* why) {
        layer.set_tuned(target.bucket, choice);
        const double err = error_of_set0();
        if (err < tolerance) return true;
        *why = "relative L2 error " + std::to_string(err) + " vs the CPU reference";
        return false;
      },
      progress);
  const TuningChoice winner = tuner.tune(
      candidates_for(c, target.bucket, current_device_arch(), layer.dev_overrides().tune_wgmma));
  layer.set_tuned(target.bucket, winner);
  return winner;
}

std::string bucket_label(const AutotuneTarget& target) {
  return "bucket " + std::to_string(target.bucket) + " (T=" + std::to_string(target.num_tokens) + ")";
}

}  // namespace

std::string MoELayerImpl::autotune(const AutotuneOptions& options) {
  const std::vector<AutotuneTarget> targets = autotune_targets(options, max_tokens_);
  if (!weights_.w13)
    throw Error("weights", "set_weights was not called; autotune checks candidates on the layer's weights");
  Tuner::ProgressFn progress = options.progress;
  if (!progress) progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  const TuningDevice device = current_tuning_device();
  const TuningKey key = TuningKey::make(device, config_);
  // A forced backend tunes a restricted candidate list: its winner must not
  // stand in for the auto winner of the shared key (docs/tuning.md).
  const bool may_save = config_.options.backend == "auto";
  std::optional<TuningCache> cache;
  if (!options.cache_path.empty()) {
    cache = TuningCache::load(options.cache_path, device);
    for (const std::string& m : cache->messages()) progress(m);
  }

  OwnStream stream;
  AutotuneRun run{*this, options, ref::seeds_for(kAutotuneSeed), {}, nullptr,
                  DeviceWeightSource(config_, weights_), {}, stream.s};
  if (weights_.x_scale)
    UNIMOE_CUDA_CHECK(cudaMemcpy(&run.static_scales.x, weights_.x_scale, 4, cudaMemcpyDeviceToHost));
  if (weights_.act_scale)
    UNIMOE_CUDA_CHECK(cudaMemcpy(&run.static_scales.act, weights_.act_scale, 4, cudaMemcpyDeviceToHost));
  if (config_.routing.has_bias) {
    run.host_routing_bias = ref::host_bias(config_, run.seeds);
    run.routing_bias = std::make_unique<DeviceMem>(run.host_routing_bias.size() * 4);
    UNIMOE_CUDA_CHECK(cudaMemcpy(run.routing_bias->p, run.host_routing_bias.data(),
                                 run.host_routing_bias.size() * 4, cudaMemcpyHostToDevice));
  }

  std::string report;
  int saved = 0;
  for (const AutotuneTarget& target : targets) {
    const std::optional<TuningChoice> cached = cache ? cache->find(key, target.bucket) : std::nullopt;
    if (cached && backend_allows(config_.options.backend, cached->path)) {
      set_tuned(target.bucket, *cached);
      progress(bucket_label(target) + ": cached winner, no timing: " + cached->to_string());
      report += bucket_label(target) + ": cached: " + cached->to_string() + "\n";
      continue;
    }
    progress("tuning " + bucket_label(target) + ":");
    const std::optional<TuningChoice> before = tuned_choice(target.bucket);
    TuningChoice winner;
    try {
      winner = tune_bucket(run, target, progress);
    } catch (...) {
      // The bucket goes back to what served it before.
      if (before)
        set_tuned(target.bucket, *before);
      else
        clear_tuned(target.bucket);
      throw;
    }
    report += bucket_label(target) + ": tuned: " + winner.to_string() + "\n";
    if (cache && may_save) {
      cache->put(key, target.bucket, winner);
      ++saved;
    }
  }
  if (saved > 0) {
    cache->save(options.cache_path);
    progress("tuning cache written: " + options.cache_path);
  } else if (cache && !may_save) {
    report += "options.backend '" + config_.options.backend +
              "' restricts the candidates: winners not saved to " + options.cache_path + "\n";
  }
  return report;
}

}  // namespace unimoe
