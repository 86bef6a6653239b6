// The C ABI's expert parallelism (unimoe_c.h): an EPLayer over an NCCL
// communicator it makes from the caller's id, and owns.
#include <memory>
#include <string>
#include <thread>

#include "capi/capi_status.h"
#include "unimoe/ep.h"

#ifdef UNIMOE_WITH_CUDA
#include "layer/moe_layer.h"
#include "layer/nccl_runtime.h"
#endif

// Destroyed in reverse: the view, the layer, the transport, then the
// communicator. NCCL frees a communicator only once every CUDA graph that
// captured an operation of it is destroyed (ncclCommDestroy waits for
// them), so a layer whose forward was captured hands its communicator to a
// thread of its own: destroying the layer before the graph (Python frees
// a function's locals in the order they were bound) then returns instead
// of waiting for a graph the same thread would destroy next.
struct unimoe_ep {
#ifdef UNIMOE_WITH_CUDA
  ncclComm* comm = nullptr;
  std::unique_ptr<unimoe::EPTransport> transport;
  std::unique_ptr<unimoe::EPLayer> layer;
  unimoe_layer local{};
  bool captured = false;  // a forward ran inside a stream capture
  ~unimoe_ep() {
    layer.reset();
    transport.reset();
    if (captured && comm)
      std::thread([c = comm] { unimoe::nccl::destroy(c); }).detach();
    else
      unimoe::nccl::destroy(comm);
  }
#endif
};


using unimoe::capi::guarded;

namespace {

int no_layer() {
  unimoe::capi::set_error("layer is null", "layer");
  return UNIMOE_ERROR_VALUE;
}

#ifndef UNIMOE_WITH_CUDA
int no_cuda() {
  unimoe::capi::set_error("this build of unimoe has no CUDA library (nvcc was not found when it was "
                          "built): expert parallelism needs it", "");
  return UNIMOE_ERROR_UNSUPPORTED;
}
#endif

void require(const void* p, const char* field) {
  if (!p) throw unimoe::Error(field, "is null");
}

}  // namespace

#ifdef UNIMOE_WITH_CUDA
namespace {

// unimoe_ep_create and unimoe_ep_create_with_scratch: the layer over a
// communicator made from `id` (scratch null: the layer's own buffers).
int create_ep(const char* config_text, int max_tokens, const void* id, size_t id_bytes,
              int world_size, int rank, void* scratch, size_t scratch_size, bool with_scratch,
              unimoe_ep** out) {
  return guarded([&] {
    require(config_text, "config");
    require(id, "id");
    require(out, "out");
    *out = nullptr;
    const unimoe::MoEConfig config = unimoe::MoEConfig::parse(config_text);
    if (world_size < 1 || world_size > unimoe::EPLayer::kMaxWorldSize)
      throw unimoe::Error("world_size", "is " + std::to_string(world_size) + "; allowed: 1.." +
                                            std::to_string(unimoe::EPLayer::kMaxWorldSize));
    if (rank < 0 || rank >= world_size)
      throw unimoe::Error("rank", "is " + std::to_string(rank) + "; allowed: 0.." + std::to_string(world_size - 1));
    const std::string why = unimoe::nccl_support();
    if (!why.empty()) throw std::runtime_error("NCCL: " + why);
    // Checked before the communicator exists, so that a bad scratch fails
    // this rank's create without leaving the others in a group it left.
    if (with_scratch)
      unimoe::check_scratch({scratch, scratch_size},
                            unimoe::EPLayer::scratch_bytes(config, max_tokens, world_size),
                            max_tokens, "unimoe_ep_scratch_bytes");
    auto ep = std::make_unique<unimoe_ep>();
    ep->comm = unimoe::nccl::init_rank(std::string(static_cast<const char*>(id), id_bytes), world_size, rank);
    ep->transport = unimoe::make_nccl_transport(ep->comm);
    ep->layer = with_scratch
                    ? unimoe::EPLayer::create(config, max_tokens, *ep->transport, scratch, scratch_size)
                    : unimoe::EPLayer::create(config, max_tokens, *ep->transport);
    ep->local.impl = &ep->layer->local_layer();
    *out = ep.release();
  });
}

}  // namespace
#endif

extern "C" {

int unimoe_nccl_support(const char** out) {
#ifndef UNIMOE_WITH_CUDA
  return guarded([&] { unimoe::capi::return_string("this build has no CUDA library", out); });
#else
  return guarded([&] { unimoe::capi::return_string(unimoe::nccl_support(), out); });
#endif
}

int unimoe_nccl_unique_id(void* id, size_t id_bytes) {
#ifndef UNIMOE_WITH_CUDA
  (void)id, (void)id_bytes;
  return no_cuda();
#else
  return guarded([&] {
    require(id, "id");
    const std::string made = unimoe::nccl::unique_id();
    if (id_bytes != made.size())
      throw unimoe::Error("id_bytes", "is " + std::to_string(id_bytes) + "; an NCCL id has " +
                                          std::to_string(made.size()) + " bytes");
    made.copy(static_cast<char*>(id), made.size());
  });
#endif
}


int unimoe_ep_create(const char* config_text, int max_tokens, const void* id, size_t id_bytes,
                     int world_size, int rank, unimoe_ep** out) {
#ifndef UNIMOE_WITH_CUDA
  (void)config_text, (void)max_tokens, (void)id, (void)id_bytes, (void)world_size, (void)rank, (void)out;
  return no_cuda();
#else
  return create_ep(config_text, max_tokens, id, id_bytes, world_size, rank, nullptr, 0, false, out);
#endif
}

int unimoe_ep_scratch_bytes(const char* config_text, int max_tokens, int world_size, size_t* out) {
#ifndef UNIMOE_WITH_CUDA
  (void)config_text, (void)max_tokens, (void)world_size, (void)out;
  return no_cuda();
#else
  return guarded([&] {
    require(config_text, "config");
    require(out, "out");
    *out = unimoe::EPLayer::scratch_bytes(unimoe::MoEConfig::parse(config_text), max_tokens, world_size);
  });
#endif
}

int unimoe_ep_create_with_scratch(const char* config_text, int max_tokens, const void* id,
                                  size_t id_bytes, int world_size, int rank, void* scratch,
                                  size_t scratch_size, unimoe_ep** out) {
#ifndef UNIMOE_WITH_CUDA
  (void)config_text, (void)max_tokens, (void)id, (void)id_bytes, (void)world_size, (void)rank,
      (void)scratch, (void)scratch_size, (void)out;
  return no_cuda();
#else
  return create_ep(config_text, max_tokens, id, id_bytes, world_size, rank, scratch, scratch_size,
                   true, out);
#endif
}

void unimoe_ep_destroy(unimoe_ep* layer) { delete layer; }

int unimoe_ep_set_weights(unimoe_ep* layer, const unimoe_weights* weights) {
#ifndef UNIMOE_WITH_CUDA
  (void)layer, (void)weights;
  return no_cuda();
#else
  if (!layer) return no_layer();
  return guarded([&] {
    require(weights, "weights");
    layer->layer->set_weights(unimoe::capi::to_weights(*weights));
  });
#endif
}

int unimoe_ep_forward(unimoe_ep* layer, int num_tokens, const void* x, const void* logits,
                      const float* routing_bias, const int32_t* topk_ids, const float* topk_weights,
                      void* out, void* stream) {
#ifndef UNIMOE_WITH_CUDA
  (void)layer, (void)num_tokens, (void)x, (void)logits, (void)routing_bias, (void)topk_ids,
      (void)topk_weights, (void)out, (void)stream;
  return no_cuda();
#else
  if (!layer) return no_layer();
  return guarded([&] {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) == cudaSuccess &&
        capture != cudaStreamCaptureStatusNone)
      layer->captured = true;
    layer->layer->forward(
        unimoe::capi::forward_args(num_tokens, x, logits, routing_bias, topk_ids, topk_weights, out),
        static_cast<CUstream_st*>(stream));
  });
#endif
}

int unimoe_ep_local_layer(unimoe_ep* layer, unimoe_layer** out) {
#ifndef UNIMOE_WITH_CUDA
  (void)layer, (void)out;
  return no_cuda();
#else
  if (!layer) return no_layer();
  return guarded([&] {
    require(out, "out");
    *out = &layer->local;
  });
#endif
}

int unimoe_ep_bytes(const unimoe_ep* layer, size_t* sent_per_call, size_t* buffer_bytes) {
#ifndef UNIMOE_WITH_CUDA
  (void)layer, (void)sent_per_call, (void)buffer_bytes;
  return no_cuda();
#else
  if (!layer) return no_layer();
  return guarded([&] {
    if (sent_per_call) *sent_per_call = layer->layer->bytes_sent_per_call();
    if (buffer_bytes) *buffer_bytes = layer->layer->buffer_bytes();
  });
#endif
}

}  // extern "C"
