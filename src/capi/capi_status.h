// What every function of the C ABI shares: the per-thread last error and
// returned string, and the wrapper that turns an exception into a status.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

#include "unimoe/unimoe.h"
#include "unimoe/unimoe_c.h"

#include <memory>

// A layer the ABI made (owned), or the one an EP layer holds (impl only).
struct unimoe_layer {
  std::unique_ptr<unimoe::MoELayer> owned;
  unimoe::MoELayer* impl = nullptr;
};

namespace unimoe::capi {

void set_error(const std::string& message, const std::string& field);
// The C struct as unimoe::ExpertWeights (the same fields).
ExpertWeights to_weights(const unimoe_weights& w);
void clear_error();
// The C forward's arguments as unimoe::ForwardArgs.
ForwardArgs forward_args(int num_tokens, const void* x, const void* logits, const float* routing_bias,
                         const int32_t* topk_ids, const float* topk_weights, void* out);
// Keeps `s` in this thread's returned-string slot and points *out at it.
void return_string(std::string s, const char** out);

// Runs fn(); an exception becomes the status of its kind, with the message
// (and an unimoe::Error's field) kept as the last error.
template <typename Fn>
int guarded(Fn&& fn) {
  try {
    fn();
    return UNIMOE_OK;
  } catch (const Error& e) {
    set_error(e.what(), e.field());
    return UNIMOE_ERROR_VALUE;
  } catch (const std::invalid_argument& e) {
    set_error(e.what(), "");
    return UNIMOE_ERROR_VALUE;
  } catch (const std::exception& e) {
    set_error(e.what(), "");
    return UNIMOE_ERROR_RUNTIME;
  } catch (...) {
    set_error("unknown exception", "");
    return UNIMOE_ERROR_RUNTIME;
  }
}

// An unimoe::Error for a null pointer the call needs.
void require_pointer(const void* p, const char* field);

}  // namespace unimoe::capi
