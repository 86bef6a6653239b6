// Device-side random fills with the counter-based generator of
// core/hash_random.h: element i of a buffer filled with (seed, scale) is
// round(hash_uniform(seed, i) * scale), so the host can regenerate any slice
// (one expert's weights, say) without copying it back.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/hash_random.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

namespace unimoe {

#if defined(__CUDACC__)
// The bf16 bits of element i of launch_fill_bf16(out, n, seed, scale). The
// fill and the kernels that regenerate it on the fly instead of reading a
// filled buffer (kernels/quant/fp8_weights.cuh) share this one expression.
__device__ __forceinline__ uint16_t fill_bf16_element(uint64_t seed, std::size_t i, float scale) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(hash_uniform(seed, i) * scale));
}
#endif

// bf16 values, rounded to nearest even.
void launch_fill_bf16(uint16_t* out, std::size_t n, uint64_t seed, float scale, cudaStream_t stream);
void launch_fill_f32(float* out, std::size_t n, uint64_t seed, float scale, cudaStream_t stream);

// A streaming copy of `bytes` (a multiple of 16) with 16-byte accesses: the
// benchmark's bandwidth ceiling. cudaMemcpy's device-to-device copy reached
// only 2.77 TB/s on an H200 where kernels stream at about 4.3.
void launch_copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);

// A read-only stream of `bytes` (a multiple of 16; 16-byte loads, eight in
// flight a thread): the other half of the bandwidth ceiling. The decode
// GEMMs mostly read, and a copy's write traffic costs the HBM turnarounds a
// read does not, so a copy alone understates what a read can reach. `sink`
// (one word) is written only for an input no fill produces.
void launch_read(const void* src, std::size_t bytes, uint32_t* sink, cudaStream_t stream);

}  // namespace unimoe
