// unimoe-bench --routing-sweep: times the routing + sort/permute variants
// (split: the routing kernel, then permute's count, scan and scatter
// kernels, the count folded into the octet routing kernel where the plan
// says; fused: one block does both; cluster: a thread-block cluster does
// both) over (policy, E, K, T) on the GPU, checks that every variant writes
// the same outputs, and records which one the layer's rule
// (routing_variant_for) would take and the plan of each variant. Each
// variant runs through the layer's own launch function
// (launch_routing_permute) with the plan plan_routing makes for it. JSON
// for scripts/analyze_routing_sweep.py.
#include "bench.h"

#if defined(UNIMOE_WITH_CUDA)

#include <cuda_runtime.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "json_file.h"
#include "layer/graph_timing.h"
#include "kernels/common/common.cuh"
#include "kernels/common/fill.cuh"
#include "kernels/routing/fused_routing.cuh"
#include "support/launch_floor.cuh"
#include "kernels/permute/permute.cuh"
#include "kernels/routing/routing.cuh"
#include "plan/layer_plan.h"
#include "plan/routing_plan.h"

namespace unimoe::bench {
namespace {

constexpr int kCallsPerGraph = 8;  // back-to-back calls per replay: launch gaps as in a layer
constexpr int kSweepTileM = 16;    // one tile schedule, as the layer's decode plan
constexpr float kLogitScale = 4.0f;
constexpr float kBiasScale = 0.01f;

// Buffers for the largest point of the sweep, shared by every point.
struct SweepBuffers {
  SweepBuffers(int max_tokens, int max_experts, int max_rows, std::size_t scratch_bytes)
      : logits(std::size_t(max_tokens) * max_experts * 4),
        bias(std::size_t(max_experts) * 4),
        ids(std::size_t(max_rows) * 4),
        weights(std::size_t(max_rows) * 4),
        counts(std::size_t(max_experts) * 4),
        offsets(std::size_t(max_experts + 1) * 4),
        p2e(std::size_t(max_rows) * 4),
        e2p(std::size_t(max_rows) * 4),
        tiles(std::size_t(max_tiles(max_rows, max_experts, kSweepTileM)) * sizeof(DeviceTile)),
        num_tiles(4),
        scratch(scratch_bytes) {}
  DeviceMem logits, bias, ids, weights, counts, offsets, p2e, e2p, tiles, num_tiles, scratch;
};

// What a variant wrote, copied back for the comparison.
struct Written {
  std::vector<int32_t> ids, counts, offsets, p2e, e2p, tiles;
  std::vector<float> weights;
  int32_t num_tiles = 0;
  bool operator==(const Written& o) const {
    return ids == o.ids && counts == o.counts && offsets == o.offsets && p2e == o.p2e &&
           e2p == o.e2p && tiles == o.tiles && num_tiles == o.num_tiles &&
           weights.size() == o.weights.size() &&
           std::memcmp(weights.data(), o.weights.data(), weights.size() * 4) == 0;
  }
};

template <typename T>
std::vector<T> fetch(const DeviceMem& m, std::size_t n) {
  std::vector<T> v(n);
  UNIMOE_CUDA_CHECK(cudaMemcpy(v.data(), m.p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

Written fetch_written(const SweepBuffers& b, int rows, int e) {
  Written w;
  w.ids = fetch<int32_t>(b.ids, rows);
  w.weights = fetch<float>(b.weights, rows);
  w.counts = fetch<int32_t>(b.counts, e);
  w.offsets = fetch<int32_t>(b.offsets, e + 1);
  w.p2e = fetch<int32_t>(b.p2e, rows);
  w.e2p = fetch<int32_t>(b.e2p, rows);
  w.num_tiles = fetch<int32_t>(b.num_tiles, 1)[0];
  w.tiles = fetch<int32_t>(b.tiles, std::size_t(std::max(w.num_tiles, 0)) * 4);
  return w;
}

// On `stream`, ahead of the variant that runs next on it (a plain
// cudaMemset would run on the legacy stream, unordered with a non-blocking
// one).
void poison(const SweepBuffers& b, int rows, int e, cudaStream_t stream) {
  for (const DeviceMem* m : {&b.ids, &b.weights, &b.p2e, &b.e2p})
    UNIMOE_CUDA_CHECK(cudaMemsetAsync(m->p, 0xff, std::size_t(rows) * 4, stream));
  UNIMOE_CUDA_CHECK(cudaMemsetAsync(b.counts.p, 0xff, std::size_t(e) * 4, stream));
  UNIMOE_CUDA_CHECK(cudaMemsetAsync(b.offsets.p, 0xff, std::size_t(e + 1) * 4, stream));
  UNIMOE_CUDA_CHECK(cudaMemsetAsync(b.num_tiles.p, 0xff, 4, stream));
  UNIMOE_CUDA_CHECK(cudaMemsetAsync(
      b.tiles.p, 0xff, std::size_t(max_tiles(rows, e, kSweepTileM)) * sizeof(DeviceTile), stream));
}

}  // namespace

int run_routing_sweep(const SweepOptions& opt) {
  if (!gpu_or_explain("--routing-sweep")) return 2;
  const std::vector<RoutingSweepPoint> points = routing_sweep_points(opt.grid);
  if (points.empty()) throw Error("routing-sweep", "the grid has no legal point");
  int max_t = 1, max_e = 1, max_rows = 1;
  std::size_t max_scratch = 0;
  for (const RoutingSweepPoint& p : points) {
    max_t = std::max(max_t, p.num_tokens);
    max_e = std::max(max_e, p.routing.num_experts);
    max_rows = std::max(max_rows, p.num_tokens * p.routing.top_k);
    max_scratch = std::max(max_scratch, permute_scratch_bytes(p.num_tokens, p.routing.top_k,
                                                              p.routing.num_experts));
  }
  const SweepBuffers b(max_t, max_e, max_rows, max_scratch);
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  UNIMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  DeviceMem evict_sink(
      opt.evict_icache ? std::size_t(icache_evict_sink_floats(prop.multiProcessorCount)) * 4 : 4);
  if (opt.evict_icache)
    std::printf("routing sweep: --evict-icache: each call follows two code-evicting kernels, whose "
                "time the reported times include\n");

  nlohmann::json doc;
  doc["tool"] = "unimoe-bench --routing-sweep";
  doc["version"] = kVersion;
  doc["device"] = prop.name;
  doc["calls_per_graph"] = kCallsPerGraph;
  doc["tile_m"] = kSweepTileM;
  doc["iters"] = opt.iters;
  doc["evict_icache"] = opt.evict_icache;
  doc["points"] = nlohmann::json::array();
  int mismatches = 0;
  // Written every 2000 points too, so a sweep cut short by a time limit
  // still leaves what it measured ("complete": false).
  auto write_doc = [&](bool complete) {
    doc["mismatches"] = mismatches;
    doc["complete"] = complete;
    write_json_file(doc, opt.json_path);
  };
  std::fprintf(stderr, "routing sweep: %zu points on %s\n", points.size(), prop.name);
  for (std::size_t i = 0; i < points.size(); ++i) {
    const RoutingSweepPoint& pt = points[i];
    const int t = pt.num_tokens, k = pt.routing.top_k, e = pt.routing.num_experts;
    const int rows = t * k;
    launch_fill_f32(b.logits.as<float>(), std::size_t(t) * e, 1000 + i, kLogitScale, stream);
    launch_fill_f32(b.bias.as<float>(), e, 7, kBiasScale, stream);
    RoutingParams r;
    r.logits = b.logits.p;
    r.bias = pt.routing.has_bias ? b.bias.as<float>() : nullptr;
    r.num_tokens = t;
    r.config = pt.routing;
    r.topk_ids = b.ids.as<int32_t>();
    r.topk_weights = b.weights.as<float>();
    PermuteParams p;
    p.topk_ids = b.ids.as<int32_t>();
    p.num_tokens = t;
    p.top_k = k;
    p.num_local = e;
    p.expert_counts = b.counts.as<int32_t>();
    p.expert_offsets = b.offsets.as<int32_t>();
    p.permuted_to_expanded = b.p2e.as<int32_t>();
    p.expanded_to_permuted = b.e2p.as<int32_t>();
    p.num_tile_sizes = 1;
    p.tile_m[0] = kSweepTileM;
    p.tiles[0] = b.tiles.as<DeviceTile>();
    p.num_tiles[0] = b.num_tiles.as<int32_t>();
    p.scratch = b.scratch.p;
    // The plan of each forced variant, as a layer of this routing config
    // with the sweep's development overrides would make it.
    RoutingDeviceCaps caps;
    probe_routing_device_caps(pt.routing, caps);
    MoEConfig config;
    config.routing = pt.routing;
    auto plan_of = [&](const char* variant) {
      config.options.routing_variant = variant;
      return plan_routing(config, t, false, caps, opt.dev);
    };
    const RoutingPlan split_plan = plan_of("split");
    const RoutingPlan fused_plan = plan_of("fused");
    const RoutingPlan cluster_plan = plan_of("cluster");
    auto split = [&] { launch_routing_permute(r, p, split_plan, stream); };
    auto fused = [&] { launch_routing_permute(r, p, fused_plan, stream); };
    auto cluster = [&] { launch_routing_permute(r, p, cluster_plan, stream); };
    auto time = [&](const std::function<void()>& variant) {
      cudaGraphExec_t g = capture(stream, [&] {
        for (int c = 0; c < kCallsPerGraph; ++c) {
          if (opt.evict_icache)
            launch_icache_evict(prop.multiProcessorCount, evict_sink.as<float>(), stream);
          variant();
        }
      });
      const double us = median_replay_us(g, stream, opt.iters, kCallsPerGraph);
      cudaGraphExecDestroy(g);
      return us;
    };
    nlohmann::json row = {{"policy", to_string(pt.routing.policy)},
                          {"E", e},
                          {"K", k},
                          {"n_group", pt.routing.n_group},
                          {"topk_group", pt.routing.topk_group},
                          {"T", t},
                          {"rule", routing_variant_name(routing_variant_for(pt.routing, t))}};
    row["split_plan"] = split_plan.to_string();
    row["split_us"] = time(split);
    if (routing_limits::fused_routing_fits(t, k, e)) {
      row["fused_plan"] = fused_plan.to_string();
      row["cluster_plan"] = cluster_plan.to_string();
      row["fused_us"] = time(fused);
      row["cluster_us"] = time(cluster);
      poison(b, rows, e, stream);
      split();
      UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      const Written want = fetch_written(b, rows, e);
      bool same = true;
      for (const auto& [name, variant] :
           {std::pair<const char*, std::function<void()>>{"fused", fused}, {"cluster", cluster}}) {
        poison(b, rows, e, stream);
        variant();
        UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
        if (fetch_written(b, rows, e) == want) continue;
        same = false;
        std::fprintf(stderr, "  MISMATCH between split and %s at %s\n", name, pt.label().c_str());
      }
      row["outputs_match"] = same;
      mismatches += same ? 0 : 1;
    } else {
      row["fused_us"] = nullptr;  // the fused and cluster kernels do not serve this size
      row["cluster_us"] = nullptr;
    }
    doc["points"].push_back(row);
    if ((i + 1) % 200 == 0 || i + 1 == points.size())
      std::fprintf(stderr, "  %zu / %zu points\n", i + 1, points.size());
    if ((i + 1) % 2000 == 0) write_doc(false);
  }
  UNIMOE_CUDA_CHECK(cudaStreamDestroy(stream));
  write_doc(true);
  std::printf("routing sweep: %zu points, %d points where fused or cluster output differs from split; wrote %s\n",
              points.size(), mismatches, opt.json_path.c_str());
  return mismatches == 0 ? 0 : 1;
}

}  // namespace unimoe::bench

#endif  // UNIMOE_WITH_CUDA (without it: gpu_runner.cpp)
