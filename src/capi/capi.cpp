// The C ABI (unimoe_c.h): errors, configs and the GPU layer. The CPU
// reference's entry point is in ref_forward.cpp.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "capi/capi_status.h"
#include "unimoe/hf_config.h"


namespace unimoe::capi {
namespace {

struct ThreadState {
  std::string error, field, returned;
};

ThreadState& state() {
  thread_local ThreadState s;
  return s;
}

#ifdef UNIMOE_WITH_CUDA
constexpr bool kHasCuda = true;
#else
constexpr bool kHasCuda = false;

// The status of create in a build without the CUDA library.
int no_cuda() {
  set_error("this build of unimoe has no CUDA library (nvcc was not found when it was built); "
            "only the CPU reference is available", "");
  return UNIMOE_ERROR_UNSUPPORTED;
}
#endif

int null_layer() {
  set_error("layer is null", "layer");
  return UNIMOE_ERROR_VALUE;
}


}  // namespace

ExpertWeights to_weights(const unimoe_weights& w) {
  ExpertWeights out;
  out.w13 = w.w13;
  out.w2 = w.w2;
  out.b13 = w.b13;
  out.b2 = w.b2;
  out.w13_scale = w.w13_scale;
  out.w2_scale = w.w2_scale;
  out.x_scale = w.x_scale;
  out.act_scale = w.act_scale;
  out.w13_block_scale = w.w13_block_scale;
  out.w2_block_scale = w.w2_block_scale;
  out.w13_interleaved = w.w13_interleaved != 0;
  return out;
}

ForwardArgs forward_args(int num_tokens, const void* x, const void* logits, const float* routing_bias,
                         const int32_t* topk_ids, const float* topk_weights, void* out) {
  ForwardArgs a;
  a.num_tokens = num_tokens;
  a.x = x;
  a.logits = logits;
  a.routing_bias = routing_bias;
  a.topk_ids = topk_ids;
  a.topk_weights = topk_weights;
  a.out = out;
  return a;
}

void set_error(const std::string& message, const std::string& field) {
  state().error = message;
  state().field = field;
}

void clear_error() { set_error("", ""); }

void return_string(std::string s, const char** out) {
  state().returned = std::move(s);
  if (out) *out = state().returned.c_str();
}

void require_pointer(const void* p, const char* field) {
  if (p == nullptr) throw Error(field, "is null");
}

}  // namespace unimoe::capi

using unimoe::capi::guarded;
using unimoe::capi::require_pointer;
using unimoe::capi::return_string;

#ifdef UNIMOE_WITH_CUDA
namespace {

// A unimoe_layer owning what `make` creates from the parsed config, into *out.
template <typename Make>
int create_layer(const char* config_text, unimoe_layer** out, Make&& make) {
  return guarded([&] {
    require_pointer(config_text, "config");
    require_pointer(out, "out");
    *out = nullptr;
    auto layer = std::make_unique<unimoe_layer>();
    layer->owned = make(unimoe::MoEConfig::parse(config_text));
    layer->impl = layer->owned.get();
    *out = layer.release();
  });
}

}  // namespace
#endif

extern "C" {

int unimoe_abi_version(void) { return UNIMOE_C_ABI_VERSION; }
const char* unimoe_version(void) { return unimoe::kVersion; }
int unimoe_has_cuda(void) { return unimoe::capi::kHasCuda ? 1 : 0; }
const char* unimoe_last_error(void) { return unimoe::capi::state().error.c_str(); }
const char* unimoe_last_error_field(void) { return unimoe::capi::state().field.c_str(); }

int unimoe_config_normalize(const char* text, int validate, const char** out) {
  return guarded([&] {
    require_pointer(text, "config");
    const unimoe::MoEConfig c = unimoe::MoEConfig::parse(text);
    if (validate) unimoe::validate(c);
    return_string(c.to_string(), out);
  });
}

int unimoe_config_from_hf_json(const char* json_text, const char** out) {
  return guarded([&] {
    require_pointer(json_text, "hf_config");
    return_string(unimoe::config_from_hf_json(json_text).to_string(), out);
  });
}

int unimoe_layer_create(const char* config_text, int max_tokens, unimoe_layer** out) {
#ifndef UNIMOE_WITH_CUDA
  (void)config_text, (void)max_tokens, (void)out;
  return unimoe::capi::no_cuda();
#else
  return create_layer(config_text, out, [&](const unimoe::MoEConfig& c) {
    return unimoe::MoELayer::create(c, max_tokens);
  });
#endif
}

int unimoe_layer_scratch_bytes(const char* config_text, int max_tokens, size_t* out) {
#ifndef UNIMOE_WITH_CUDA
  (void)config_text, (void)max_tokens, (void)out;
  return unimoe::capi::no_cuda();
#else
  return guarded([&] {
    require_pointer(config_text, "config");
    require_pointer(out, "out");
    *out = unimoe::MoELayer::scratch_bytes(unimoe::MoEConfig::parse(config_text), max_tokens);
  });
#endif
}

int unimoe_layer_create_with_scratch(const char* config_text, int max_tokens, void* scratch,
                                     size_t scratch_size, unimoe_layer** out) {
#ifndef UNIMOE_WITH_CUDA
  (void)config_text, (void)max_tokens, (void)scratch, (void)scratch_size, (void)out;
  return unimoe::capi::no_cuda();
#else
  return create_layer(config_text, out, [&](const unimoe::MoEConfig& c) {
    return unimoe::MoELayer::create(c, max_tokens, scratch, scratch_size);
  });
#endif
}

void unimoe_layer_destroy(unimoe_layer* layer) { delete layer; }

int unimoe_layer_set_weights(unimoe_layer* layer, const unimoe_weights* weights) {
  if (!layer) return unimoe::capi::null_layer();
  return guarded([&] {
    require_pointer(weights, "weights");
    layer->impl->set_weights(unimoe::capi::to_weights(*weights));
  });
}

int unimoe_layer_forward(unimoe_layer* layer, int num_tokens, const void* x, const void* logits,
                         const float* routing_bias, const int32_t* topk_ids,
                         const float* topk_weights, void* out, void* stream) {
  if (!layer) return unimoe::capi::null_layer();
  return guarded([&] {
    layer->impl->forward(
        unimoe::capi::forward_args(num_tokens, x, logits, routing_bias, topk_ids, topk_weights, out),
        static_cast<CUstream_st*>(stream));
  });
}

int unimoe_layer_describe(const unimoe_layer* layer, int num_tokens, const char** out) {
  if (!layer) return unimoe::capi::null_layer();
  return guarded([&] { return_string(layer->impl->describe(num_tokens), out); });
}

int unimoe_layer_workspace_bytes(const unimoe_layer* layer, size_t* out) {
  if (!layer) return unimoe::capi::null_layer();
  return guarded([&] {
    require_pointer(out, "out");
    *out = layer->impl->workspace_bytes();
  });
}

int unimoe_layer_use_tuning_cache(unimoe_layer* layer, const char* path, const char** out) {
  if (!layer) return unimoe::capi::null_layer();
  return guarded([&] {
    require_pointer(path, "path");
    return_string(layer->impl->use_tuning_cache(path), out);
  });
}

int unimoe_layer_autotune(unimoe_layer* layer, const int* tokens, int num_tokens_list,
                          const char* routing, int iters, int check_tokens,
                          const char* cache_path, int quiet, const char** out) {
  if (!layer) return unimoe::capi::null_layer();
  return guarded([&] {
    if (num_tokens_list < 0)
      throw unimoe::Error("autotune.tokens", "count is " + std::to_string(num_tokens_list));
    if (num_tokens_list > 0) require_pointer(tokens, "autotune.tokens");
    unimoe::AutotuneOptions o;
    o.tokens.assign(tokens, tokens + num_tokens_list);
    if (routing) o.routing = routing;
    o.iters = iters;
    o.check_tokens = check_tokens;
    if (cache_path) o.cache_path = cache_path;
    if (quiet) o.progress = [](const std::string&) {};
    return_string(layer->impl->autotune(o), out);
  });
}

}  // extern "C"
