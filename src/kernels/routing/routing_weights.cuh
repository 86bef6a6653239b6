// The weight of each chosen expert, per policy (chosen_weight), with the
// warp sums over a token's chosen lanes. Part of routing_device.cuh.
#pragma once

#include <cmath>

#include "kernels/routing/routing_keys.cuh"

namespace unimoe::routing_detail {

// The lanes of this lane's aligned segment of `width` (a power of two).
__device__ __forceinline__ unsigned segment_lanes(int width) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const unsigned ones = width >= kWarpSize ? kFullMask : (1u << width) - 1u;
  return ones << (lane & ~(width - 1));
}

// w / sum(w) over the chosen lanes; an all-zero w stays zero.
__device__ __forceinline__ double renormalize(double w, int width) {
  const double sum = chosen_sum(w, width);
  return sum == 0 ? w : w / sum;
}

// The weight of the expert this lane chose (lanes >= K pass 0 and take part
// in the warp sums only). x: its logit, NaN already -inf. A kernel built for
// the DeepSeek policies holds only their case, the others only theirs: the
// routing code runs once per call from a cold instruction cache, so code a
// kernel never runs still costs it fetch time.
// kSegments: the warp holds 32 / chosen_width tokens, token g's k-th
// expert on lane g * chosen_width + k (the split kernel's batched weights);
// every sum, maximum and count stays within a token's lanes. Without it,
// one token on lanes 0..K-1.
template <bool kDeepSeek, bool kSegments = false>
__device__ inline double chosen_weight(const RoutingKernelParams& p, const RowSoftmax& row,
                                       float x, bool active) {
  if constexpr (kDeepSeek) {
    const double s = active ? sigmoid(x) : 0.0;
    return s / (chosen_sum(s, p.chosen_width) + kDeepSeekEpsilon) * p.routed_scaling_factor;
  } else {
    switch (p.policy) {
      case RoutingPolicy::Default:
      case RoutingPolicy::RenormalizeNaive: {
        double w = 0;
        if (active) {
          w = isinf(row.max) ? (x == row.max ? 1.0 / row.ties : 0.0)
                             : exp(static_cast<double>(x) - row.max) / row.sum;
        }
        return p.policy == RoutingPolicy::RenormalizeNaive ? renormalize(w, p.chosen_width) : w;
      }
      case RoutingPolicy::Renormalize: {
        // Softmax over the chosen logits; the token's first lane holds the
        // largest, m.
        if constexpr (kSegments) {
          // m differs between tokens, so the ballot is taken on every lane.
          const float m = __shfl_sync(kFullMask, x, 0, p.chosen_width);
          const bool top = active && x == m;
          const unsigned tied = __ballot_sync(kFullMask, top) & segment_lanes(p.chosen_width);
          if (isinf(m)) return top ? 1.0 / __popc(tied) : 0.0;
          const double v = active ? exp(static_cast<double>(x) - m) : 0.0;
          return v / chosen_sum(v, p.chosen_width);
        }
        const float m = __shfl_sync(kFullMask, x, 0);
        if (isinf(m)) {
          const int ties = __popc(__ballot_sync(kFullMask, active && x == m));
          return active && x == m ? 1.0 / ties : 0.0;
        }
        const double v = active ? exp(static_cast<double>(x) - m) : 0.0;
        return v / chosen_sum(v, p.chosen_width);
      }
      case RoutingPolicy::TopK:
        return x;
      case RoutingPolicy::Sigmoid:
      case RoutingPolicy::TopKSigmoid:
      case RoutingPolicy::Llama4:
        return sigmoid(x);
      case RoutingPolicy::SigmoidRenorm:
        return renormalize(active ? sigmoid(x) : 0.0, p.chosen_width);
      case RoutingPolicy::DeepSeekV3:
      case RoutingPolicy::MiniMax2:
        break;  // kDeepSeek kernels
    }
    return 0;
  }
}

}  // namespace unimoe::routing_detail
