// The FP8Block128 stream (swap-AB) grouped GEMM (contract: stream_gemm_fp8.cuh):
// its design, validation and launch. Device code: stream_gemm_fp8_kernel.cuh;
// the launch configuration: stream_gemm_fp8_config.h.
//
// The BF16 stream kernel's design (stream_gemm.cu's header comment) with e4m3
// operands on mma.sync m16n8k32 and the numerics of DeepGEMM's and CUTLASS's
// blockwise FP8 GEMMs: the products of a 128-wide K block kb go to a fresh
// fp32 accumulator, and the running fp32 sum gets a_scale(row, kb) *
// b_scale(e, brow / 128, kb) times that block sum ("promotion"). On sm_90a
// ptxas runs an e4m3 mma.sync as exact conversions to f16 (F2FP) and two
// HMMA.16816.F32 (exact products, fp32 sums), converting a register once for
// all the mmas that read it: 8 conversions a lane per 16-byte weight load.
//
// m16n8k32 .e4m3 fragments (PTX ISA), lane (g, t) = (lane / 4, lane % 4), four
// e4m3 a .b32 (their order inside it does not matter here: A and B are
// packed alike from the same byte order): A a0 row g, k 4t..4t+3; a1 row
// g + 8, the same k; a2 / a3 as a0 / a1 at k 16+4t..19+4t. B b0 column g, k
// 4t..4t+3; b1 k 16+4t..19+4t. C c0, c1 row g, columns 2t, 2t + 1; c2, c3 row
// g + 8. The K order inside an mma is free as long as A and B agree, so a
// lane's 16-byte load of 16 consecutive K values of a row feeds two k-steps:
// step s takes bytes 8s..8s+3 as a0 / a1 / b0, 8s+4..8s+7 as a2 / a3 / b1.
//
// Multi-row tiles: a warp's 16 weight rows (lo = fragment rows g, hi = g + 8)
// load 64 bytes each per 64-wide K slab (4 lanes x 16; the L2 hint fetches
// the whole line); a block is 2 slabs, 4 k-steps, promoted with the scales
// of the lane's C entries: token rows 8f + 2t + j, weight rows lo and hi.
//
// One-token tiles: a lane loads 16 bytes at K offset 16i of a weight row pair
// (R0, R1) and the token's 16 bytes there, fed as A rows g (R0), g + 8 (R1)
// and B column g: entry (g, g) of the product is R0's dot product over the K
// values of lanes 4g..4g+3, (g + 8, g) R1's; the rest is dropped. A warp
// load is split into 32 / L units of L lanes (L = 32, 16 or 8), each loading
// 16L contiguous bytes of its own pair, so a short K (GEMM2's I) still gives
// every lane a load. Each lane scales its own diagonal entries by its own
// block's scales before the cross-lane reduction, which is exact math:
//   - lanes 4g..4g+3 are 4-aligned, so they lie in one aligned group of 8
//     lanes, hence in one unit (L is a multiple of 8) and in one 128-wide K
//     block (unit lane i holds K 16i..16i+15 of a piece that starts on a
//     block boundary, and 8 lanes x 16 values are one block);
//   - the lane holding (g, g) and (g + 8, g) is lane 4g + g/2, one of those
//     four, so its block (piece start / 128 + i / 8) is that block;
//   - the accumulator is fresh for every piece, so both entries are sums
//     over that one block of one pair. The block's other half (lanes
//     4g'..4g'+3, g' = g ^ 1) gets the same scales in lane 4g' + g'/2, and
//     the reduction adds the scaled halves: the promoted block sum up to
//     the order of fp32 additions.
// Off-diagonal entries mix blocks; a select, never a multiply, drops them.
// The token row is staged in shared memory (all warps read the same K), so
// registers hold weights only: 2 x slots x chunks = 16 16-byte loads a lane
// in flight. Unit width and slots are template parameters (a kernel each):
// a row's pieces sit at constant offsets from one address register, and
// each kernel fits 128 registers without spills (ptxas, sm_90a).
//
// Scales are staged through cp.async: the A scales of the tile's rows
// [k / 128][16], and the B scales [3][k / 128] of the 128-row blocks the
// CTA's rows lie in: row 0 for the gate or all rows (a CTA's 8 x groups or
// 16 x groups rows are aligned to that count, which divides 128), rows 1, 2
// for the up rows (up_offset plus such a multiple: at most two blocks).
//
// Given A unquantized (a_bf16 or a_f32: x at T = 1, GEMM1's activation),
// the one-token path copies the raw A row into shared memory after the
// wait and quantizes it there (kernels/quant/fp8_encode.cuh: the quantize
// kernels' rule and code), the codes where the staged codes would be and
// the scales into the A scales; that replaces a quantize kernel in the
// chain (its launch and its round trip through memory) at the cost of
// each CTA quantizing the row it reads (7168 values at most, shared memory
// to shared memory, while the first round of weight loads is in flight).
//
// K split, fixed-order reduction and PDL as in the BF16 kernel: with
// prefetch_before_wait a CTA reads its tile, issues its first weight loads
// and stages its B scales before pdl_begin(); A, its scales and the gather
// map come after it.
#include "kernels/gemm/stream_gemm_fp8.cuh"

#include <climits>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/common/common.cuh"
#include "kernels/gemm/stream_gemm_fp8_config.h"
#include "kernels/gemm/stream_gemm_fp8_kernel.cuh"

namespace unimoe {
namespace {

using fp8_stream::Fp8StreamArgs;
using fp8_stream::kBlockK;
using KernelFn = void (*)(Fp8StreamArgs);

void require(bool ok, const std::string& field, const std::string& rule) {
  if (!ok) throw std::invalid_argument("launch_fp8_stream_gemm: " + field + " " + rule);
}

bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

void validate(const Fp8StreamGemmParams& p) {
  const auto is = [](long long v) { return "is " + std::to_string(v) + "; "; };
  require(p.k > 0 && p.k % kBlockK == 0, "k", is(p.k) + "must be a positive multiple of 128");
  require(p.n_out > 0 && p.n_out % 16 == 0, "n_out",
          is(p.n_out) + "must be a positive multiple of 16");
  const int epilogue = static_cast<int>(p.epilogue);
  require(epilogue >= 0 && epilogue <= static_cast<int>(GemmEpilogue::ReLU2), "epilogue",
          is(epilogue) + "not a GemmEpilogue");
  require(p.n_out <= p.b_rows, "b_rows", is(p.b_rows) + "must be >= n_out");
  const bool up_ok = p.up_offset >= 0 && static_cast<long long>(p.up_offset) + p.n_out <= p.b_rows;
  require(!is_gated(p.epilogue) || up_ok, "up_offset",
          is(p.up_offset) + "the up rows [up_offset, up_offset + n_out) must be B rows");
  require(p.max_tiles >= 0, "max_tiles", is(p.max_tiles) + "must be >= 0");
  const bool quantize = p.a_bf16 != nullptr || p.a_f32 != nullptr;
  require(p.a_bf16 == nullptr || p.a_f32 == nullptr, "a_bf16/a_f32", "at most one may be set");
  require(quantize || p.a_scales_ld > 0, "a_scales_ld", is(p.a_scales_ld) + "must be > 0");
  const int row_scale = static_cast<int>(p.a_row_scale);
  require(row_scale >= 0 && row_scale <= static_cast<int>(fp8_encode::RowScale::kRow),
          "a_row_scale", is(row_scale) + "not a RowScale");
  require(!quantize || p.a_row_scale != fp8_encode::RowScale::kGiven || p.a_given_scale != nullptr,
          "a_given_scale", "must be set where a_row_scale is kGiven");
  require(!quantize || p.a_row_scale != fp8_encode::RowScale::kMaxima ||
              (p.a_given_scale != nullptr && p.a_maxima > 0),
          "a_given_scale/a_maxima", "kMaxima needs the maxima and their count (> 0)");
  require(p.out_maxima == nullptr || quantize, "out_maxima",
          "is written by the kernels that quantize their own A (a_bf16 or a_f32)");
  require(p.gather == nullptr || p.top_k >= 1, "top_k", is(p.top_k) + "must be >= 1");
  require((p.out_f32 != nullptr) != (p.out_bf16 != nullptr), "out_f32/out_bf16",
          "exactly one must be set");
  require(p.fold.counters == nullptr || finalize_fold_valid(p.fold, p.out_bf16, p.n_out), "fold",
          "needs out_bf16 = fold.finalize.y, hidden = n_out (a multiple of 8), top_k 1..32 "
          "and its routing pointers and out");
  const struct {
    const void* ptr;
    const char* name;
    size_t align;
    bool required;
  } pointers[] = {{p.a, "a", 16, !quantize},     {p.a_scales, "a_scales", 4, !quantize},
                  {p.a_bf16, "a_bf16", 16, false}, {p.a_f32, "a_f32", 16, false},
                  {p.a_given_scale, "a_given_scale", 4, false},
                  {p.a_scale_out, "a_scale_out", 4, false},
                  {p.out_maxima, "out_maxima", 4, false},
                  {p.gather, "gather", 4, false}, {p.b, "b", 16, true},
                  {p.b_scales, "b_scales", 4, true}, {p.bias, "bias", 4, false},
                  {p.tiles, "tiles", 4, true},    {p.num_tiles, "num_tiles", 4, true},
                  {p.out_f32, "out_f32", 4, false}, {p.out_bf16, "out_bf16", 2, false}};
  for (const auto& q : pointers)
    require((q.ptr != nullptr || !q.required) && aligned(q.ptr, q.align), q.name,
            std::string(q.required ? "must be non-null and " : "must be ") +
                std::to_string(q.align) + "-byte aligned");
}

// The kernel of a one-token shape: 1, 2 or 4 slots, at most kUnitLanes / 4
// (fp8_stream_config's rule), or 8 for a wide CTA of 16-lane units; the
// form that quantizes A itself or the one that reads its codes; with the
// folded finalize or without.
template <int kUnitLanes, bool kQuantizeA, bool kFold>
KernelFn kernel_for(int slots) {
  static_assert(kFp8StreamMaxSlots == 4, "slot counts 1, 2, 4; 8 for wide 16-lane CTAs");
  constexpr int kMost = kUnitLanes / 4 < 4 ? kUnitLanes / 4 : 4;
  if constexpr (kUnitLanes == 16)
    if (slots == 8) return fp8_stream::fp8_stream_gemm_kernel<16, 8, kQuantizeA, kFold>;
  return slots == 1   ? fp8_stream::fp8_stream_gemm_kernel<kUnitLanes, 1, kQuantizeA, kFold>
         : slots == 2 ? fp8_stream::fp8_stream_gemm_kernel<kUnitLanes, 2, kQuantizeA, kFold>
                      : fp8_stream::fp8_stream_gemm_kernel<kUnitLanes, kMost, kQuantizeA, kFold>;
}

template <bool kQuantizeA, bool kFold>
KernelFn kernel_for(const Fp8StreamConfig& c) {
  return c.unit_lanes == 8    ? kernel_for<8, kQuantizeA, kFold>(c.slots)
         : c.unit_lanes == 16 ? kernel_for<16, kQuantizeA, kFold>(c.slots)
                              : kernel_for<32, kQuantizeA, kFold>(c.slots);
}

}  // namespace

int fp8_stream_grid_ctas(const Fp8StreamGemmParams& p) {
  const Fp8StreamConfig c = fp8_stream_config(p.k, p.n_out, is_gated(p.epilogue), p.max_tiles,
                                              current_device_sm_count(), p.wide_ctas);
  const long long blocks = static_cast<long long>(p.max_tiles) * c.n_blocks;
  require(blocks <= INT_MAX, "max_tiles", "x column blocks = " + std::to_string(blocks) +
                                              " exceeds the grid limit");
  return static_cast<int>(blocks);
}

void launch_fp8_stream_gemm(const Fp8StreamGemmParams& p, KernelStream stream) {
  validate(p);
  if (p.max_tiles == 0) return;
  Fp8StreamArgs args;
  args.p = p;
  args.gated = is_gated(p.epilogue);
  args.c = fp8_stream_config(p.k, p.n_out, args.gated, p.max_tiles, current_device_sm_count(),
                             p.wide_ctas);
  args.k_blocks = p.k / kBlockK;
  args.b_row_blocks = ceil_div(p.b_rows, kBlockK);
  const long long blocks = static_cast<long long>(p.max_tiles) * args.c.n_blocks;
  require(blocks <= INT_MAX, "max_tiles", "x column blocks = " + std::to_string(blocks) +
                                              " exceeds the grid limit");
  const bool quantize_a = p.a_bf16 != nullptr || p.a_f32 != nullptr;
  const bool fold = p.fold.counters != nullptr;
  const KernelFn kernel = quantize_a ? (fold ? kernel_for<true, true>(args.c)
                                             : kernel_for<true, false>(args.c))
                                     : (fold ? kernel_for<false, true>(args.c)
                                             : kernel_for<false, false>(args.c));
  // The token row (k bytes), the A scales [k / 128][16], the B scales [3][k
  // / 128], and the raw A row where the kernel quantizes it.
  const size_t smem = fp8_stream::fp8_stream_smem_bytes(p, &args.raw_offset);
  // Past 48 KB of dynamic and static shared memory together (the K-split
  // partials are static, and up to 256 bytes of flags and maxima: the
  // folded finalize's, the row quantization's) a kernel must opt in.
  const size_t static_smem = sizeof(float) * fp8_stream::kWarps * 8 * 32 + 256;
  if (smem + static_smem > 48 * 1024)
    UNIMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  launch_pdl(kernel, static_cast<unsigned>(blocks), fp8_stream::kThreads, smem, stream, args);
  UNIMOE_LAUNCH_CHECK();
}

}  // namespace unimoe
