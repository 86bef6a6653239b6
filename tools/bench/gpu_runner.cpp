// The GPU run: for each shape and T, the layer's median time by CUDA-graph
// replay (inputs rotated across several sets), the time of each stage,
// the two ceilings measured in the same run, and a check of the output
// against the CPU reference on the first tokens.
#include "bench.h"

#if defined(UNIMOE_WITH_CUDA)

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>

#include "layer/graph_timing.h"
#include "ref/synthetic.h"
#include "kernels/common/common.cuh"
#include "kernels/common/fill.cuh"
#include "layer/layer_access.h"
#include "layer/moe_layer.h"
#include "plan/autotune.h"
#include "support/device_weights.h"
#include "plan/tuning.h"

namespace unimoe::bench {
namespace {

using namespace unimoe::ref;

constexpr int kDefaultRotate = 4;
// Tuner's own lines ("timed ...", "rejected ...", "winner ..."), which the
// point's tuning_log keeps (scripts/autotune_table.py reads "timed" ones).
bool is_tuner_line(const std::string& line) {
  for (const char* prefix : {"timed ", "rejected ", "winner "})
    if (line.rfind(prefix, 0) == 0) return true;
  return false;
}

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLASLt ") + what + " failed: status " +
                             std::to_string(static_cast<int>(status)));
}

// The e4m3 ceiling: an 8192^3 GEMM through cuBLASLt, e4m3 operands (A
// transposed, the layout its FP8 kernels take), fp32 accumulation, bf16 out.
double measure_fp8_matmul_tflops(cudaStream_t stream) {
  const int n = 8192;
  const std::size_t elems = std::size_t(n) * n;
  const std::size_t ws_bytes = std::size_t(32) << 20;
  DeviceMem a(elems), b(elems), d(elems * 2), workspace(ws_bytes);
  // Any bytes do for timing: fill them from bf16 draws.
  launch_fill_bf16(a.as<uint16_t>(), elems / 2, 3, 1.0f, stream);
  launch_fill_bf16(b.as<uint16_t>(), elems / 2, 4, 1.0f, stream);
  cublasLtHandle_t lt;
  check_lt(cublasLtCreate(&lt), "create");
  cublasLtMatmulDesc_t op;
  check_lt(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans), "transa");
  check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof no_trans), "transb");
  cublasLtMatrixLayout_t la, lb, ld;
  check_lt(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, n), "layout a");
  check_lt(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, n), "layout b");
  check_lt(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, n), "layout d");
  cublasLtMatmulPreference_t pref;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws_bytes, sizeof ws_bytes),
           "workspace preference");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  check_lt(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &heuristic, &found),
           "heuristic");
  if (found == 0) throw std::runtime_error("cuBLASLt has no e4m3 GEMM for this device");
  const float one = 1.0f, zero = 0.0f;
  auto gemm = [&] {
    check_lt(cublasLtMatmul(lt, op, &one, a.p, la, b.p, lb, &zero, d.p, ld, d.p, ld,
                            &heuristic.algo, workspace.p, ws_bytes, stream),
             "matmul");
  };
  gemm();
  UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraphExec_t g = capture(stream, gemm);
  const double us = median_replay_us(g, stream, 10, 1);
  cudaGraphExecDestroy(g);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  return 2.0 * n * n * double(n) / (us * 1e6);
}

constexpr double kMaxReadOverCopy = 1.5;

Ceilings measure_ceilings(cudaStream_t stream) {
  Ceilings c;
  const std::size_t bytes = std::size_t(1) << 31;
  {
    DeviceMem a(bytes), b(bytes);
    UNIMOE_CUDA_CHECK(cudaMemsetAsync(a.p, 1, bytes, stream));
    cudaGraphExec_t g = capture(stream, [&] {
      launch_copy(b.p, a.p, bytes, stream);
    });
    const double us = median_replay_us(g, stream, 20, 1);
    cudaGraphExecDestroy(g);
    c.copy_tbps = 2.0 * bytes / (us * 1e6);
    DeviceMem sink(sizeof(uint32_t));
    cudaGraphExec_t r = capture(stream, [&] {
      launch_read(a.p, bytes, sink.as<uint32_t>(), stream);
    });
    const double read_us = median_replay_us(r, stream, 20, 1);
    cudaGraphExecDestroy(r);
    c.read_tbps = bytes / (read_us * 1e6);
    c.bandwidth_tbps = floor_bandwidth(c.copy_tbps, c.read_tbps);
    // A read well above the copy would mean loads the compiler or the
    // hardware skipped (H200: copy 3.97 TB/s, weight streams 4.35-4.6):
    // such a ceiling would make every floor too low, so it is not used.
    if (c.read_tbps > kMaxReadOverCopy * c.copy_tbps) {
      std::fprintf(stderr, "  the read stream (%.3f TB/s) is over %.1fx the copy (%.3f TB/s): the floors use the copy\n",
                   c.read_tbps, kMaxReadOverCopy, c.copy_tbps);
      c.bandwidth_tbps = c.copy_tbps;
    }
  }
  {
    const int n = 8192;
    const std::size_t elems = std::size_t(n) * n;
    DeviceMem a(elems * 2), b(elems * 2), d(elems * 2);
    launch_fill_bf16(a.as<uint16_t>(), elems, 1, 1.0f, stream);
    launch_fill_bf16(b.as<uint16_t>(), elems, 2, 1.0f, stream);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
    cublasSetStream(h, stream);
    const float one = 1.0f, zero = 0.0f;
    auto gemm = [&] {
      if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a.p, CUDA_R_16BF, n, b.p,
                       CUDA_R_16BF, n, &zero, d.p, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        throw std::runtime_error("cublasGemmEx failed");
    };
    gemm();
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraphExec_t g = capture(stream, gemm);
    const double us = median_replay_us(g, stream, 10, 1);
    cudaGraphExecDestroy(g);
    cublasDestroy(h);
    c.matmul_tflops = 2.0 * n * n * double(n) / (us * 1e6);
  }
  c.fp8_matmul_tflops = measure_fp8_matmul_tflops(stream);
  return c;
}

// One input set: x, logits and the output of one forward.
struct InputSet {
  std::unique_ptr<DeviceMem> x, logits, out;
  ForwardArgs args;
};

// autotune: tune each T's bucket with the layer's autotuner, which reuses
// the winners in opt.tuning_cache and saves new ones there.
void run_shape(const Options& opt, const Preset& shape, const std::string& backend,
               bool autotune, cudaStream_t stream, RunResult& result) {
  const std::string& name = shape.name;
  MoEConfig c = shape.config;
  if (!opt.logits_type.empty()) c.routing.logits_type = parse_logits_type(opt.logits_type);
  c.options.backend = backend;
  const int max_t = *std::max_element(opt.tokens.begin(), opt.tokens.end());
  c.options.routing_variant = opt.routing_variant;
  const std::unique_ptr<MoELayer> made = layer_access::create(c, max_t, opt.dev);
  MoELayer& layer = *made;
  MoELayerImpl& internals = layer_access::impl(layer);
  const Seeds seeds = seeds_for(0x5eed);
  const std::size_t e = c.local_experts(), h = c.experts.hidden;
  // bf16 fills, or their e4m3 codes and scales for the FP8 variants, with
  // the values HostWeights regenerates for the reference.
  const SyntheticDeviceWeights device_weights(c, seeds, stream, opt.static_scales);
  DeviceMem bias(c.routing.num_experts * 4);
  launch_fill_f32(bias.as<float>(), c.routing.num_experts, seeds.bias, kRoutingBiasScale, stream);
  UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  layer.set_weights(device_weights.weights());
  if (!autotune && !opt.tuning_cache.empty())
    std::fprintf(stderr, "  %s\n", layer.use_tuning_cache(opt.tuning_cache).c_str());
  HostWeights host_weights(c, seeds);
  const std::vector<float> host_routing_bias = host_bias(c, seeds);
  const int rotate = opt.rotate > 0 ? opt.rotate : kDefaultRotate;

  for (int t : opt.tokens) {
    std::vector<InputSet> sets(rotate);
    SyntheticInputs set0;  // the set checked against the reference
    for (int s = 0; s < rotate; ++s) {
      InputSet& in = sets[s];
      in.x = std::make_unique<DeviceMem>(std::size_t(t) * h * 2);
      // The autotuner's and the CPU run's inputs: the logits in the
      // config's type (bf16 rounded to nearest even).
      if (s == 0) set0 = synthetic_inputs(c, t, seeds, s, opt.routing);
      const SyntheticInputs synthetic = s == 0 ? set0 : synthetic_inputs(c, t, seeds, s, opt.routing);
      const DeviceLogits& logits = synthetic.logits;
      in.logits = std::make_unique<DeviceMem>(logits.bytes.size());
      in.out = std::make_unique<DeviceMem>(std::size_t(t) * h * 2);
      launch_fill_bf16(in.x->as<uint16_t>(), std::size_t(t) * h, synthetic.x_seed, kXScale, stream);
      UNIMOE_CUDA_CHECK(cudaMemcpy(in.logits->p, logits.bytes.data(), logits.bytes.size(),
                                   cudaMemcpyHostToDevice));
      UNIMOE_CUDA_CHECK(cudaMemsetAsync(in.out->p, 0xff, std::size_t(t) * h * 2, stream));
      in.args.num_tokens = t;
      in.args.x = in.x->p;
      in.args.logits = in.logits->p;
      in.args.routing_bias = c.routing.has_bias ? bias.as<float>() : nullptr;
      in.args.out = in.out->p;
    }
    // Set 0 last, so the workspace holds its routing for the checks below.
    for (int s = rotate - 1; s >= 0; --s) layer.forward(sets[s].args, stream);
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));

    Point p;
    p.preset = name;
    p.backend = backend;
    p.config = c.to_string();
    p.tokens = t;
    std::vector<int32_t> counts(e);
    UNIMOE_CUDA_CHECK(cudaMemcpy(counts.data(), internals.expert_counts(), e * 4, cudaMemcpyDeviceToHost));
    p.active_experts = static_cast<double>(std::count_if(counts.begin(), counts.end(), [](int n) { return n > 0; }));

    // The reference output of input set 0's first `check` tokens, computed
    // once; every candidate and the final layer are compared with it.
    const int check = std::min(t, opt.check_tokens);
    std::vector<float> want;
    double tie_bound = 0.0;
    if (check > 0) {
      // The reference routes on the values the device read.
      const ref::Routing routing = ref::route(c.routing, set0.logits.values.data(), check,
                                              c.routing.has_bias ? host_routing_bias.data() : nullptr);
      const std::vector<float> x = host_x(c, check, set0.x_seed);
      // FP8PerTensor's dynamic scales are one amax over all T tokens: the
      // reference of `check` tokens takes the ones set 0's forward computed.
      double allowance = 0.0;
      want = ref::moe_forward(c, host_weights.source(), x.data(), routing, 0,
                              opt.static_scales ? device_weights.static_scales()
                                                : internals.dynamic_activation_scales(t),
                              &allowance);
      // FP8: the intermediate's near ties may move the output that much more.
      tie_bound = ref::relative_flip_allowance(allowance, want);
    }
    std::vector<ForwardArgs> set_args;
    for (const InputSet& in : sets) set_args.push_back(in.args);
    auto error_of_set0 = [&] { return forward_error(layer, sets[0].args, want, stream); };
    // The layer's time: every input set's forward in one graph, per forward.
    auto time_layer = [&] { return median_forward_us(layer, set_args, stream, opt.iters); };

    if (autotune) {
      // The layer's own autotuner (layer/autotune.cu) with this point's
      // options; Tuner's lines also go to the point's tuning_log.
      AutotuneOptions ao;
      ao.tokens = {t};
      ao.routing = opt.routing;
      ao.iters = opt.iters;
      ao.check_tokens = opt.check_tokens;
      ao.cache_path = opt.tuning_cache;
      ao.progress = [&](const std::string& line) {
        if (is_tuner_line(line)) {
          std::fprintf(stderr, "    %s\n", line.c_str());
          p.tuning_log.push_back(line);
        } else {
          std::fprintf(stderr, "  %s %s\n", name.c_str(), line.c_str());
        }
      };
      layer.autotune(ao);
      p.choice = internals.tuned_choice(token_bucket(t))->to_string();
    }
    if (check > 0) {
      p.rel_err = error_of_set0();
      p.error_bound = reference_tolerance(c.experts.quant) + tie_bound;
      p.failed = !(p.rel_err <= p.error_bound);  // NaN fails too
    }
    p.plan = layer.describe(t);
    p.time_us = time_layer();
    if (internals.plan_for(t).gemm2_mode == Gemm2Mode::Gate) {
      Gemm2GateRecord r;
      UNIMOE_CUDA_CHECK(cudaMemcpy(&r, internals.gemm2_gate_record(), sizeof r, cudaMemcpyDeviceToHost));
      p.gemm2_gate = r.path == static_cast<int>(Gemm2Path::Combine) ? "combine" : "expert";
      p.gemm2_work = {{"tiles", r.tiles}, {"rows", r.rows}, {"active", r.active}, {"chunks", r.chunks}};
    }
    // Stage s's time: the chain of stages 0..s minus the chain of stages
    // 0..s-1, every input set in one graph as for the layer's time. Each
    // stage so runs after its real predecessors on its own set's routing:
    // timed alone, a GEMM stage would repeat one set's experts, whose
    // weights L2 partly keeps at small T (measured on an H200: 6.5 us too
    // little for qwen3-30b-a3b at T=1). A stage that launches nothing reads about 0.
    double before = 0;
    for (std::size_t s = 0; s < kStages.size(); ++s) {
      cudaGraphExec_t g = capture(stream, [&] {
        for (const InputSet& in : sets)
          for (std::size_t q = 0; q <= s; ++q) internals.run_stage(kStages[q], in.args, stream);
      });
      const double chain = median_replay_us(g, stream, std::max(5, opt.iters / 2), rotate);
      cudaGraphExecDestroy(g);
      p.stage_us.emplace_back(stage_name(kStages[s]), chain - before);
      before = chain;
    }
    p.floor = layer_floor(c, t, p.active_experts, result.ceilings);
    p.stage_floor = stage_floors(c, t, p.active_experts, result.ceilings);
    std::fprintf(stderr, "  %s %s T=%d: %.1f us (floor %.1f us, err %.2e)\n", name.c_str(), backend.c_str(), t,
                 p.time_us, p.floor.floor_us, p.rel_err);
    result.points.push_back(p);
  }
}

}  // namespace

bool gpu_available(std::string* reason) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    *reason = err != cudaSuccess ? std::string("no CUDA device: ") + cudaGetErrorString(err) : "no CUDA device";
    return false;
  }
  cudaDeviceProp prop{};
  UNIMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    *reason = std::string("device ") + prop.name + " is not Hopper (sm_90)";
    return false;
  }
  return true;
}

RunResult run_gpu(const Options& opt) {
  RunResult result;
  result.mode = "gpu";
  cudaDeviceProp prop{};
  UNIMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  result.device = prop.name;
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::fprintf(stderr, "measuring ceilings on %s ...\n", prop.name);
  result.ceilings = measure_ceilings(stream);
  std::fprintf(stderr,
               "  bandwidth %.3f TB/s (copy %.3f, read %.3f), bf16 matmul %.1f TFLOP/s, e4m3 matmul %.1f TFLOP/s\n",
               result.ceilings.bandwidth_tbps, result.ceilings.copy_tbps, result.ceilings.read_tbps,
               result.ceilings.matmul_tflops, result.ceilings.fp8_matmul_tflops);
  for (const Preset& shape : opt.shapes)
    for (const std::string& backend : opt.backends)
      run_shape(opt, shape, backend, opt.autotune, stream, result);
  cudaStreamDestroy(stream);
  return result;
}

}  // namespace unimoe::bench

#else  // no CUDA in this build

#include <cstdio>

namespace unimoe::bench {

bool gpu_available(std::string* reason) {
  *reason = "this build has no CUDA library (nvcc was not found at configure time)";
  return false;
}

RunResult run_gpu(const Options&) { throw std::runtime_error("built without CUDA"); }

int run_routing_sweep(const SweepOptions&) {
  std::fprintf(stderr, "unimoe-bench --routing-sweep needs a GPU: built without CUDA\n");
  return 2;
}

int run_stream_patterns(const StreamPatternOptions&) {
  std::fprintf(stderr, "unimoe-bench --stream-patterns needs a GPU: built without CUDA\n");
  return 2;
}

int run_launch_floor(const LaunchFloorOptions&) {
  std::fprintf(stderr, "unimoe-bench --launch-floor needs a GPU: built without CUDA\n");
  return 2;
}

int run_ep_bench(const EPBenchOptions&) {
  std::fprintf(stderr, "unimoe-bench --ep needs GPUs: built without CUDA\n");
  return 2;
}

}  // namespace unimoe::bench

#endif
