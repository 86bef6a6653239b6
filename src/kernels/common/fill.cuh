// Device-side random fills with the counter-based generator of
// core/hash_random.h: element i of a buffer filled with (seed, scale) is
// round(hash_uniform(seed, i) * scale), so the host can regenerate any slice
// (one expert's weights, say) without copying it back.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace unimoe {

// bf16 values, rounded to nearest even.
void launch_fill_bf16(uint16_t* out, std::size_t n, uint64_t seed, float scale, cudaStream_t stream);
void launch_fill_f32(float* out, std::size_t n, uint64_t seed, float scale, cudaStream_t stream);

// A streaming copy of `bytes` (a multiple of 16) with 16-byte accesses: the
// benchmark's bandwidth ceiling. cudaMemcpy's device-to-device copy reached
// only 2.77 TB/s on an H200 where kernels stream at about 4.3.
void launch_copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);

}  // namespace unimoe
