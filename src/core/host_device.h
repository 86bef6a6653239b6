// UNIMOE_HD: a function callable from host and device code, for headers that
// both the CUDA kernels and the host library (no CUDA headers) include.
#pragma once

#if defined(__CUDACC__)
#define UNIMOE_HD __host__ __device__ __forceinline__
#else
#define UNIMOE_HD inline
#endif
