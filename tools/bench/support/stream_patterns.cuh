// Weight-streaming access patterns, timed alone (unimoe-bench
// --stream-patterns): the instrument for the decode GEMMs' bandwidth
// question. At T=1 the stream and m16 kernels move their weights at 2.7-3.3
// TB/s where a linear copy reaches ~4 and the peers' GEMMs 4.3-4.6
// (measured on an H200). Each pattern reads a [rows, k] bf16 matrix once,
// with the decode kernels' work split (a warp per 16 rows and a K chunk),
// and folds what it read into `sink` so that nothing is skipped; only the
// way bytes are requested differs:
//   Rows16x64B: the stream kernel's loads: an instruction covers 16 rows
//     (8 a load, two loads) x 64 bytes; `slabs` 32-wide K slabs in flight;
//   Rows4x128B: an instruction covers 4 rows x 128 bytes;
//   Row1x512B: an instruction covers one row's 512 contiguous bytes;
//   Bulk: each warp's 16 row pieces come in as 1D bulk copies
//     (cp.async.bulk, one per row and stage) into shared memory, two stages;
//   Linear: the whole matrix as one array, 16 bytes a lane, grid-stride (the
//     copy ceiling's order, reads only);
//   Rows16x64BL2x128 / Row1x512BL2x256: as Rows16x64B / Row1x512B with the
//     load's L2 prefetch-size hint (.L2::128B / .L2::256B): the L2 fetches
//     the whole 128 / 256-byte block a request falls in;
//   CpAsyncRow1x512B: Row1x512B's requests as 16-byte cp.async.cg copies
//     into shared memory (the tiled GEMMs' way), the round's 8 KB a warp
//     awaited together, then read back from shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace unimoe {

enum class StreamPattern {
  Rows16x64B,
  Rows4x128B,
  Row1x512B,
  Bulk,
  Linear,
  Rows16x64BL2x128,
  Row1x512BL2x256,
  CpAsyncRow1x512B
};
inline constexpr StreamPattern kStreamPatterns[] = {
    StreamPattern::Rows16x64B,       StreamPattern::Rows4x128B,      StreamPattern::Row1x512B,
    StreamPattern::Bulk,             StreamPattern::Linear,          StreamPattern::Rows16x64BL2x128,
    StreamPattern::Row1x512BL2x256,  StreamPattern::CpAsyncRow1x512B};
const char* stream_pattern_name(StreamPattern p);

struct StreamPatternArgs {
  const uint16_t* w = nullptr;  // [rows, k] bf16, 16-byte aligned
  long long rows = 0;           // a multiple of 16
  int k = 0;                    // a multiple of k_chunk
  int k_chunk = 0;              // K per warp, a multiple of 256
  uint32_t* sink = nullptr;     // one word per CTA
};

// Launches one read of the matrix (8 warps a CTA; a warp per 16 rows and
// k_chunk). Throws std::invalid_argument for shapes it does not take.
void launch_stream_pattern(StreamPattern pattern, const StreamPatternArgs& args,
                           cudaStream_t stream);

// CTAs launch_stream_pattern uses for `args` (the sink's length).
long long stream_pattern_ctas(const StreamPatternArgs& args);

}  // namespace unimoe
