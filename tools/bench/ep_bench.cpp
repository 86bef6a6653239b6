// unimoe-bench --ep N: the expert-parallel layer over NCCL, one process per
// GPU. The parent forks N ranks before touching CUDA; rank 0 writes NCCL's
// unique id to a file the others read; each rank builds its slice of the
// model's experts, checks its first tokens against the CPU reference, and
// times the whole call and each step by CUDA-graph replay, and an NCCL
// all-to-all of the dispatch's bytes for comparison. Each rank writes its
// figures to a file; the parent prints the table and writes the JSON.
#include "bench.h"

#if defined(UNIMOE_WITH_CUDA)

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "json_file.h"
#include "kernels/common/common.cuh"
#include "kernels/common/fill.cuh"
#include "layer/ep_layer.h"
#include "layer/graph_timing.h"
#include "layer/layer_access.h"
#include "layer/nccl_runtime.h"
#include "plan/autotune.h"
#include "ref/ep.h"
#include "ref/ref.h"
#include "ref/synthetic.h"
#include "support/device_weights.h"
#include "unimoe/ep.h"

namespace unimoe::bench {

using nlohmann::json;
using namespace ref;

namespace {

std::string read_id(const std::string& path, int wait_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream f(path, std::ios::binary);
    if (f) {
      std::string id((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      if (!id.empty()) return id;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw std::runtime_error("no NCCL id in " + path + " after " + std::to_string(wait_s) + " s");
}

// One (shape, T) point on this rank: its figures as JSON.
json run_point(const EPBenchOptions& opt, const Preset& shape, int t, EPTransport& transport,
               cudaStream_t stream) {
  MoEConfig c = shape.config;
  const int rank = transport.rank(), world = transport.world_size();
  std::unique_ptr<EPLayer> layer = ep_access::create(c, t, transport, opt.dev);
  const EPGeometry& g = ep_access::geometry(*layer);
  // The whole model's synthetic weights on every rank (FP8PerTensor with
  // its static activation scales, which EP needs); each rank serves its
  // slice, and a single-GPU layer over all of them runs beside it.
  const Seeds seeds = seeds_for(0x5eed);
  const SyntheticDeviceWeights weights(c, seeds, stream, c.experts.quant == QuantVariant::FP8PerTensor);
  DeviceMem bias(c.routing.num_experts * 4);
  launch_fill_f32(bias.as<float>(), c.routing.num_experts, seeds.bias, kRoutingBiasScale, stream);
  UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  layer->set_weights(slice_experts(weights.weights(), c, rank * g.experts_per_rank, g.experts_per_rank));

  // This rank's tokens: input set `rank` of the synthetic inputs.
  const std::size_t h = c.experts.hidden;
  const SyntheticInputs in = synthetic_inputs(c, t, seeds, rank, opt.routing);
  DeviceMem x(std::max<std::size_t>(1, std::size_t(t) * h * 2)), out(std::max<std::size_t>(1, std::size_t(t) * h * 2));
  DeviceMem logits(std::max<std::size_t>(1, in.logits.bytes.size()));
  launch_fill_bf16(x.as<uint16_t>(), std::size_t(t) * h, in.x_seed, kXScale, stream);
  UNIMOE_CUDA_CHECK(cudaMemcpy(logits.p, in.logits.bytes.data(), in.logits.bytes.size(), cudaMemcpyHostToDevice));
  UNIMOE_CUDA_CHECK(cudaMemsetAsync(out.p, 0xff, std::size_t(t) * h * 2, stream));
  ForwardArgs a;
  a.num_tokens = t;
  a.x = x.p;
  a.logits = logits.p;
  a.routing_bias = c.routing.has_bias ? bias.as<float>() : nullptr;
  a.out = out.p;
  layer->forward(a, stream);
  UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));

  // The single-GPU layer over every expert, on the same tokens and the
  // routing the EP layer's dispatch computed (so that the two layers'
  // weights agree to the bit, and both plan for precomputed routing).
  DeviceMem single_out(std::max<std::size_t>(1, std::size_t(t) * h * 2));
  {
    const std::unique_ptr<MoELayer> single = layer_access::create(c, t, opt.dev);
    single->set_weights(weights.weights());
    ForwardArgs b = a;
    b.topk_ids = ep_access::routed_ids(*layer);
    b.topk_weights = ep_access::routed_weights(*layer);
    b.out = single_out.p;
    single->forward(b, stream);
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  json p;
  p["preset"] = shape.name;
  p["tokens"] = t;
  p["rank"] = rank;
  p["world_size"] = world;
  p["config"] = c.to_string();
  p["local_plan"] = layer->local_layer().describe(g.local_tokens());
  // Against the single-GPU layer: every token within the bound, and the
  // tokens whose experts sit on one rank bit for bit where the two plans
  // agree (always at W = 1, where the local layer sees the same T).
  std::vector<uint16_t> ep_bits(std::size_t(t) * h), single_bits(std::size_t(t) * h);
  UNIMOE_CUDA_CHECK(cudaMemcpy(ep_bits.data(), out.p, ep_bits.size() * 2, cudaMemcpyDeviceToHost));
  UNIMOE_CUDA_CHECK(cudaMemcpy(single_bits.data(), single_out.p, single_bits.size() * 2, cudaMemcpyDeviceToHost));
  const std::vector<float> host_routing_bias = host_bias(c, seeds);
  const Routing all_routing = route(c.routing, in.logits.values.data(), t,
                                    c.routing.has_bias ? host_routing_bias.data() : nullptr);
  std::vector<float> single_values(single_bits.size());
  for (std::size_t j = 0; j < single_bits.size(); ++j) single_values[j] = bf16_to_f32(single_bits[j]);
  const double vs_single = relative_l2_error(ep_bits, single_values);
  int confined = 0, confined_equal = 0;
  for (int r = 0; r < t; ++r) {
    int home = -1;
    bool one = true;
    for (int k = 0; k < c.routing.top_k; ++k) {
      const int d = g.rank_of_expert(all_routing.ids[std::size_t(r) * c.routing.top_k + k]);
      if (d < 0) continue;
      one = one && (home < 0 || home == d);
      home = d;
    }
    if (!one) continue;
    ++confined;
    confined_equal += std::equal(ep_bits.begin() + std::size_t(r) * h, ep_bits.begin() + std::size_t(r + 1) * h,
                                 single_bits.begin() + std::size_t(r) * h);
  }
  p["rel_err_vs_single"] = vs_single;
  p["confined_tokens"] = confined;
  p["confined_bitwise"] = confined_equal;
  bool failed = !(vs_single < reference_tolerance(c.experts.quant)) || (world == 1 && confined_equal != confined);
  // The reference of this rank's first tokens.
  const int check = std::min(t, opt.check_tokens);
  if (check > 0) {
    const Routing routing = route(c.routing, in.logits.values.data(), check,
                                  c.routing.has_bias ? host_routing_bias.data() : nullptr);
    const std::vector<float> hx = host_x(c, check, in.x_seed);
    HostWeights host(c, seeds);
    const std::vector<float> want = ep_forward(c, world, host.source(), hx.data(), routing, 0,
                                               weights.static_scales());
    const std::vector<uint16_t> bits(ep_bits.begin(), ep_bits.begin() + std::size_t(check) * h);
    const double err = relative_l2_error(bits, want);
    p["rel_err"] = err;
    failed = failed || !(err < reference_tolerance(c.experts.quant));
  }
  p["failed"] = failed;

  // Times: the whole call, each step alone, and an all-to-all of the
  // dispatch's bytes (one array of x + ids + weights chunks).
  cudaGraphExec_t whole = capture(stream, [&] { layer->forward(a, stream); });
  p["us"] = median_replay_us(whole, stream, opt.iters, 1);
  cudaGraphExecDestroy(whole);
  json steps = json::object();
  for (EPLayer::Step s : kEPSteps) {
    cudaGraphExec_t one = capture(stream, [&] { layer->run_step(s, a, stream); });
    steps[ep_step_name(s)] = median_replay_us(one, stream, opt.iters, 1);
    cudaGraphExecDestroy(one);
  }
  p["step_us"] = steps;
  const std::size_t chunk = g.x_chunk_bytes() + g.ids_chunk_bytes() + g.weights_chunk_bytes();
  DeviceMem send(chunk * world), recv(chunk * world);
  const EPTransport::Array array = {send.p, recv.p, chunk};
  cudaGraphExec_t a2a = capture(stream, [&] { transport.all_to_all(&array, 1, stream); });
  const double a2a_us = median_replay_us(a2a, stream, opt.iters, 1);
  cudaGraphExecDestroy(a2a);
  // Bytes to the other ranks; bus bandwidth as NCCL's tests count it for
  // all-to-all: bytes sent to others over time.
  const double sent = double(chunk) * (world - 1);
  p["dispatch_bytes_to_others"] = sent;
  p["nccl_alltoall_us"] = a2a_us;
  const double exchange_us = steps[ep_step_name(EPLayer::Step::Exchange)].get<double>();
  p["exchange_GBps"] = exchange_us > 0 ? sent / exchange_us * 1e-3 : 0.0;
  p["nccl_alltoall_GBps"] = a2a_us > 0 ? sent / a2a_us * 1e-3 : 0.0;
  p["bytes_sent_per_call"] = double(layer->bytes_sent_per_call());
  p["buffer_bytes"] = double(layer->buffer_bytes());
  return p;
}

// The body of rank `rank`: returns its exit code.
int run_rank(const EPBenchOptions& opt, int rank, const std::string& dir) {
  try {
    int devices = 0;
    UNIMOE_CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (devices < opt.world_size)
      throw std::runtime_error("--ep " + std::to_string(opt.world_size) + " needs " +
                               std::to_string(opt.world_size) + " GPUs; this machine has " +
                               std::to_string(devices));
    UNIMOE_CUDA_CHECK(cudaSetDevice(rank));
    const std::string why = nccl_support();
    if (!why.empty()) throw std::runtime_error(why);
    const std::string id_path = dir + "/nccl-id";
    if (rank == 0) {
      const std::string id = nccl::unique_id();
      std::ofstream(id_path + ".tmp", std::ios::binary) << id;
      std::rename((id_path + ".tmp").c_str(), id_path.c_str());
    }
    ncclComm* comm = nccl::init_rank(read_id(id_path, 120), opt.world_size, rank);
    std::unique_ptr<EPTransport> transport = make_nccl_transport(comm);
    cudaStream_t stream;
    UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    json points = json::array();
    bool failed = false;
    for (const Preset& shape : opt.shapes)
      for (int t : opt.tokens) {
        json p = run_point(opt, shape, t, *transport, stream);
        failed = failed || p.value("failed", false);
        points.push_back(p);
      }
    json doc;
    doc["nccl_version"] = nccl::version();
    cudaDeviceProp prop{};
    UNIMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, rank));
    doc["device"] = prop.name;
    doc["points"] = points;
    std::ofstream(dir + "/rank-" + std::to_string(rank) + ".json") << doc.dump();
    cudaStreamDestroy(stream);
    transport.reset();
    nccl::destroy(comm);
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unimoe-bench --ep rank %d: %s\n", rank, e.what());
    return 2;
  }
}

}  // namespace

int run_ep_bench(const EPBenchOptions& opt) {
  if (opt.world_size < 1 || opt.world_size > EPLayer::kMaxWorldSize)
    throw Error("ep", "is " + std::to_string(opt.world_size) + "; allowed: 1.." +
                          std::to_string(EPLayer::kMaxWorldSize));
  char tmpl[] = "/tmp/unimoe-ep-XXXXXX";
  const char* made = mkdtemp(tmpl);
  if (!made) throw std::runtime_error("cannot make a temporary folder for the NCCL id");
  const std::string dir = made;
  std::fflush(nullptr);
  std::vector<pid_t> ranks;
  for (int r = 0; r < opt.world_size; ++r) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) std::_Exit(run_rank(opt, r, dir));
    ranks.push_back(pid);
  }
  // A rank that fails leaves its peers waiting in NCCL: end them.
  int worst = 0, left = opt.world_size;
  while (left > 0) {
    int status = 0;
    const pid_t done = wait(&status);
    if (done < 0) break;
    --left;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 3;
    worst = std::max(worst, code);
    if (code >= 2)
      for (pid_t p : ranks) kill(p, SIGTERM);
  }

  json doc;
  doc["mode"] = "ep";
  doc["world_size"] = opt.world_size;
  doc["routing"] = opt.routing;
  json points = json::array();
  for (int r = 0; r < opt.world_size; ++r) {
    std::ifstream f(dir + "/rank-" + std::to_string(r) + ".json");
    if (!f) continue;
    json rank_doc = json::parse(f, nullptr, false);
    if (rank_doc.is_discarded()) continue;
    doc["device"] = rank_doc["device"];
    doc["nccl_version"] = rank_doc["nccl_version"];
    for (auto& p : rank_doc["points"]) points.push_back(p);
  }
  doc["points"] = points;
  std::printf("expert parallelism over NCCL %s, %d ranks, %s routing\n",
              doc.value("nccl_version", std::string("?")).c_str(), opt.world_size, opt.routing.c_str());
  std::printf("%-16s %6s %4s %9s %9s %9s %9s %9s %9s %10s %10s %9s %9s %11s\n", "preset", "T", "rank", "us",
              "dispatch", "exchange", "experts", "return", "combine", "xchg GB/s", "a2a GB/s", "rel_err",
              "vs_single", "bitwise");
  for (const auto& p : points) {
    const json& s = p["step_us"];
    const std::string bitwise = std::to_string(p.value("confined_bitwise", 0)) + "/" +
                                std::to_string(p.value("confined_tokens", 0));
    std::printf("%-16s %6d %4d %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %10.1f %10.1f %9.2e %9.2e %11s%s\n",
                p["preset"].get<std::string>().c_str(), p["tokens"].get<int>(), p["rank"].get<int>(),
                p["us"].get<double>(), s["dispatch"].get<double>(), s["exchange"].get<double>(),
                s["experts"].get<double>(), s["return"].get<double>(), s["combine"].get<double>(),
                p["exchange_GBps"].get<double>(), p["nccl_alltoall_GBps"].get<double>(),
                p.value("rel_err", 0.0), p.value("rel_err_vs_single", 0.0), bitwise.c_str(),
                p.value("failed", false) ? "  FAILED" : "");
  }
  write_json_file(doc, opt.json_path);
  std::printf("wrote %s\n", opt.json_path.c_str());
  if (points.size() != opt.shapes.size() * opt.tokens.size() * std::size_t(opt.world_size))
    std::fprintf(stderr, "unimoe-bench --ep: some ranks did not finish (see their messages above)\n");
  if (worst == 1)
    std::fprintf(stderr,
                 "unimoe-bench --ep: FAILED: a point over its error bound against the CPU reference or the "
                 "single-GPU layer, or (one rank) not bit for bit the single-GPU layer\n");
  return worst == 0 ? 0 : 1;
}

}  // namespace unimoe::bench

#endif  // UNIMOE_WITH_CUDA (without it: gpu_runner.cpp)
