// What a lane holds for one token between choosing and weighing
// (TokenChoice, TokenExperts), DeepSeek's selection key, and the load of a
// lane's slots from a row of E values (load_slots). Part of routing_device.cuh.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/routing/routing_keys.cuh"

namespace unimoe::routing_detail {

// What lane k < K of a warp holds after routing a token: its k-th expert,
// best first, and that expert's weight.
struct TokenChoice {
  int expert;
  float weight;
};

// What lane k < K holds between choosing a token's experts and weighing
// them: its k-th expert, that expert's logit where the selection key gave it
// back (the other policies load it when weighing), and the row's softmax
// (Default, RenormalizeNaive).
struct TokenExperts {
  int expert;
  float x;
  RowSoftmax softmax;
};

// DeepSeek's selection key of one expert, c = sigmoid(x) + bias, NaN as
// -inf; x is the logit with NaN already -inf.
__device__ __forceinline__ float deepseek_key(float x, float bias) {
  return nan_to_neg_inf(deepseek_score(x) + bias);
}

// The values of a lane's slots from a row of E (global or shared memory),
// as fp32 (bf16 widened exactly); slots at or past E get `past`.
// kWideLoads, with runs (the split kernel, throughput-bound at large T; and
// staged DeepSeek keys in shared memory): where the row is 16-byte aligned
// and E a multiple of a 16-byte load, a lane's run comes in whole 16-byte
// loads. Otherwise one load a slot.
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }

template <bool kWideLoads, typename T, int kPerLane, bool kRuns>
__device__ __forceinline__ void load_slots(const T* row, int num_experts, Slots<kPerLane, kRuns> slots,
                                           float past, float (&out)[kPerLane]) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // values in one 16-byte load
  if constexpr (kRuns && kWideLoads && kPerLane % kVec == 0) {
    if (num_experts % kVec == 0 && (reinterpret_cast<uintptr_t>(row) & 15u) == 0) {
#pragma unroll
      for (int v = 0; v < kPerLane / kVec; ++v) {
        const int e = slots.expert(v * kVec);  // the whole load lies before E or past it
        uint4 u = make_uint4(0, 0, 0, 0);
        if (e < num_experts) u = *reinterpret_cast<const uint4*>(row + e);
        const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          float value;
          if constexpr (sizeof(T) == 4) {
            value = __uint_as_float(words[i]);
          } else {  // two bf16 a word, the lower one first
            value = __uint_as_float(i % 2 == 0 ? words[i / 2] << 16 : words[i / 2] & 0xffff0000u);
          }
          out[v * kVec + i] = e < num_experts ? value : past;
        }
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = slots.expert(j);
    out[j] = e < num_experts ? widen(row[e]) : past;
  }
}

}  // namespace unimoe::routing_detail
