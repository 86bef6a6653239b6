// The expert-parallel layer's own kernels (include/unimoe/ep.h): dispatch
// packs each token into the fixed chunk of every rank that holds one of its
// experts; combine adds the partial sums the ranks return, in rank order.
// Chunk d of a send buffer holds max_tokens rows; the first counts[d] are
// tokens (in token order), the rest padding whose ids are -1 (no expert:
// the local layer skips them and writes 0 for them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace unimoe {

inline constexpr int kEPMaxWorldSize = 64;  // rank masks are 64-bit

struct EPDispatchParams {
  const uint16_t* x = nullptr;           // [T, H] bf16
  const int32_t* topk_ids = nullptr;     // [T, K]; ids outside [0, E) are on no rank
  const float* topk_weights = nullptr;   // [T, K]
  int num_tokens = 0;                    // T <= max_tokens
  int top_k = 0;
  int hidden = 0;                        // H, a multiple of 8
  int num_experts = 0;                   // E
  int experts_per_rank = 0;              // E / W
  int world_size = 0;                    // W <= kEPMaxWorldSize
  int max_tokens = 0;                    // rows of each chunk
  int32_t* slots = nullptr;              // [T, W] out: row in chunk d, or -1
  int32_t* counts = nullptr;             // [W] out: tokens sent to each rank
  uint16_t* send_x = nullptr;            // [W, max_tokens, H] out
  int32_t* send_ids = nullptr;           // [W, max_tokens, K] out
  float* send_weights = nullptr;         // [W, max_tokens, K] out
};

// Two kernels: one CTA numbers the tokens of each rank (a scan in token
// order), then a grid copies the rows and pads every chunk. Throws
// std::invalid_argument for parameters outside these limits.
void launch_ep_dispatch(const EPDispatchParams& params, cudaStream_t stream);

struct EPCombineParams {
  const uint16_t* partials = nullptr;  // [W, max_tokens, H] bf16: chunk d from rank d
  const int32_t* slots = nullptr;      // [T, W], dispatch's
  int num_tokens = 0;
  int hidden = 0;
  int world_size = 0;
  int max_tokens = 0;
  uint16_t* out = nullptr;             // [T, H] bf16
};

// out[t] = bf16(sum over d = 0..W-1 with slots[t, d] >= 0 of
// partials[d, slots[t, d]]), fp32 in rank order; 0 for a token sent nowhere.
void launch_ep_combine(const EPCombineParams& params, cudaStream_t stream);

}  // namespace unimoe
