// A user's program against the installed unimoe package: parse and validate
// a config, refuse a bad one, and where a Hopper GPU is present run one
// forward of a small layer, then two layers sharing one scratch, then an
// expert-parallel group of one (loopback) on a scratch. Exits 0 on
// success; without a GPU it says so and still exits 0 once the host side
// works.
#include <unimoe/ep.h>
#include <unimoe/unimoe.h>

#include <cmath>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(CONSUMER_WITH_GPU_LAYER)
#include <cuda_runtime.h>
#endif

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "unimoe_consumer: FAILED: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main() {
  unimoe::MoEConfig cfg =
      unimoe::MoEConfig::parse("policy=Renormalize E=8 K=2 H=256 I=128 act=SwiGLU");
  unimoe::validate(cfg);
  if (unimoe::MoEConfig::parse(cfg.to_string()).to_string() != cfg.to_string())
    return fail("config text does not round-trip");
  try {
    unimoe::MoEConfig bad = cfg;
    bad.routing.top_k = 9;  // more than E
    unimoe::validate(bad);
    return fail("validate accepted K > E");
  } catch (const unimoe::Error& e) {
    std::printf("refused as expected: field %s: %s\n", e.field().c_str(), e.what());
  }
  std::printf("unimoe %s: config %s\n", unimoe::kVersion, cfg.to_string().c_str());

#if defined(CONSUMER_WITH_GPU_LAYER)
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: the GPU layer was linked but not run\n");
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  if (prop.major != 9) {
    std::printf("device %s is not Hopper: the GPU layer was linked but not run\n", prop.name);
    return 0;
  }
  const int t = 4, e = 8, h = 256, i = 128;
  auto layer = unimoe::MoELayer::create(cfg, /*max_tokens=*/t);
  // Small weights and inputs (bf16 bit patterns of +-1/64), fp32 logits.
  std::vector<uint16_t> w13(static_cast<size_t>(e) * 2 * i * h), w2(static_cast<size_t>(e) * h * i),
      x(static_cast<size_t>(t) * h), out(static_cast<size_t>(t) * h, 0xffff);
  for (size_t k = 0; k < w13.size(); ++k) w13[k] = (k % 3 == 0) ? 0x3c80 : 0xbc80;
  for (size_t k = 0; k < w2.size(); ++k) w2[k] = (k % 5 == 0) ? 0x3c80 : 0xbc80;
  for (size_t k = 0; k < x.size(); ++k) x[k] = (k % 2 == 0) ? 0x3f80 : 0xbf80;
  std::vector<float> logits(static_cast<size_t>(t) * e);
  for (size_t k = 0; k < logits.size(); ++k) logits[k] = static_cast<float>((k * 7) % 11);
  void *d_w13, *d_w2, *d_x, *d_logits, *d_out;
  cudaMalloc(&d_w13, w13.size() * 2);
  cudaMalloc(&d_w2, w2.size() * 2);
  cudaMalloc(&d_x, x.size() * 2);
  cudaMalloc(&d_logits, logits.size() * 4);
  cudaMalloc(&d_out, out.size() * 2);
  cudaMemcpy(d_w13, w13.data(), w13.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(d_w2, w2.data(), w2.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(d_logits, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_out, out.data(), out.size() * 2, cudaMemcpyHostToDevice);
  layer->set_weights({d_w13, d_w2, nullptr, nullptr});
  unimoe::ForwardArgs args;
  args.num_tokens = t;
  args.x = d_x;
  args.logits = d_logits;
  args.out = d_out;
  layer->forward(args, nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) return fail("forward failed on the device");
  cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost);
  int unwritten = 0;
  for (uint16_t v : out) unwritten += v == 0xffff;
  std::printf("GPU forward on %s: %s; %d of %zu outputs unwritten\n", prop.name,
              layer->describe(t).c_str(), unwritten, out.size());
  if (unwritten != 0) return fail("the forward left outputs unwritten");

  // The MoE layers of a model share one scratch for their per-call
  // buffers: two layers on it, one after the other, give the bits of the
  // layer above (the forward is deterministic).
  const size_t scratch_bytes = unimoe::MoELayer::scratch_bytes(cfg, t);
  void* d_scratch = nullptr;
  cudaMalloc(&d_scratch, scratch_bytes);
  auto first = unimoe::MoELayer::create(cfg, t, d_scratch, scratch_bytes);
  auto second = unimoe::MoELayer::create(cfg, t, d_scratch, scratch_bytes);
  std::vector<uint16_t> shared_out(out.size());
  for (auto* l : {first.get(), second.get()}) {
    l->set_weights({d_w13, d_w2, nullptr, nullptr});
    cudaMemset(d_out, 0xff, out.size() * 2);
    l->forward(args, nullptr);
    if (cudaDeviceSynchronize() != cudaSuccess) return fail("a shared-scratch forward failed");
    cudaMemcpy(shared_out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost);
    if (shared_out != out) return fail("a layer on the shared scratch gave other bits");
  }
  std::printf("two layers on one %zu-byte scratch: the same bits\n", scratch_bytes);
  first.reset();
  second.reset();

  // An expert-parallel group of one over the loopback transport, its
  // buffers in a scratch: it routes with its own kernel, so its output
  // matches the layer's within the bf16 bound, not bit for bit.
  const size_t ep_bytes = unimoe::EPLayer::scratch_bytes(cfg, t, 1);
  void* d_ep_scratch = nullptr;
  cudaMalloc(&d_ep_scratch, ep_bytes);
  auto transports = unimoe::make_loopback_transports(1);
  auto ep = unimoe::EPLayer::create(cfg, t, *transports[0], d_ep_scratch, ep_bytes);
  ep->set_weights({d_w13, d_w2, nullptr, nullptr});
  cudaMemset(d_out, 0xff, out.size() * 2);
  ep->forward(args, nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) return fail("the EP forward failed");
  std::vector<uint16_t> ep_out(out.size());
  cudaMemcpy(ep_out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost);
  auto as_float = [](uint16_t bits) {
    const uint32_t word = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &word, sizeof f);
    return f;
  };
  double diff = 0.0, norm = 0.0;
  for (size_t k = 0; k < out.size(); ++k) {
    const double d = as_float(ep_out[k]) - as_float(out[k]);
    diff += d * d;
    norm += double(as_float(out[k])) * as_float(out[k]);
  }
  if (!(std::sqrt(diff) <= 1e-2 * std::sqrt(norm)))
    return fail("the EP group of one is off the layer's output");
  std::printf("an EP group of one on a %zu-byte scratch: within the bound of the layer\n", ep_bytes);
  ep.reset();
  for (void* p : {d_w13, d_w2, d_x, d_logits, d_out, d_scratch, d_ep_scratch}) cudaFree(p);
#endif
  return 0;
}
