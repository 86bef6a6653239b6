// The sm90 FP8 grouped GEMM's workspace layout, setup kernel and dispatch
// (contract: sm90_fp8_grouped_gemm.cuh). The CUTLASS kernels live in
// sm90_fp8_grouped_gemm_<tactic>.cu, one instantiation each.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/common/common.cuh"
#include "kernels/gemm/sm90_fp8_grouped_gemm.cuh"
#include "kernels/gemm/sm90_fp8_grouped_gemm_impl.cuh"

namespace unimoe {
namespace {

constexpr int kSetupThreads = 256;
// Every part of the workspace starts on this boundary (cudaMalloc's), which
// covers the TMA descriptors' 64 bytes and the 16 of everything else.
constexpr std::size_t kWorkspaceAlign = 256;

// The tactic's kernel with a bf16 D, or with an fp32 D.
const sm90_fp8::TacticEntry& tactic_entry(Sm90Fp8GemmTactic t, bool f32_out) {
  switch (t) {
    case Sm90Fp8GemmTactic::Cooperative128x128:
      return f32_out ? sm90_fp8::kCooperative128x128F32Entry : sm90_fp8::kCooperative128x128Entry;
    case Sm90Fp8GemmTactic::Pingpong64x128:
      return f32_out ? sm90_fp8::kPingpong64x128F32Entry : sm90_fp8::kPingpong64x128Entry;
    case Sm90Fp8GemmTactic::Cooperative128x128Cluster2x1:
      return f32_out ? sm90_fp8::kCooperative128x128Cluster2x1F32Entry
                     : sm90_fp8::kCooperative128x128Cluster2x1Entry;
  }
  throw std::invalid_argument("sm90 fp8 grouped GEMM: unknown tactic " +
                              std::to_string(static_cast<int>(t)));
}

std::size_t align_up(std::size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// Byte offsets of the workspace parts: the per-group arrays, then the CUTLASS
// workspace (sized for the largest tactic, so one workspace serves all).
struct WorkspaceLayout {
  std::size_t shapes = 0, a = 0, b = 0, d = 0, stride_a = 0, stride_b = 0, stride_d = 0;
  std::size_t a_scales = 0, b_scales = 0, a_scale_layouts = 0, b_scale_layouts = 0;
  std::size_t cutlass = 0;
  std::size_t total = 0;
};

WorkspaceLayout workspace_layout(int num_groups, int sm_count) {
  const std::size_t g = static_cast<std::size_t>(num_groups);
  std::size_t cutlass_bytes = 0;
  for (Sm90Fp8GemmTactic t : kSm90Fp8GemmTactics)
    for (const bool f32_out : {false, true})
      cutlass_bytes =
          std::max(cutlass_bytes, tactic_entry(t, f32_out).workspace_bytes(num_groups, sm_count));
  WorkspaceLayout l;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t offset = at;
    at = align_up(at + bytes);
    return offset;
  };
  l.shapes = take(g * sizeof(sm90_fp8::GroupShape));
  l.a = take(g * sizeof(const sm90_fp8::ElementAB*));
  l.b = take(g * sizeof(const sm90_fp8::ElementAB*));
  l.d = take(g * sizeof(void*));
  l.stride_a = take(g * sizeof(sm90_fp8::StrideA));
  l.stride_b = take(g * sizeof(sm90_fp8::StrideB));
  l.stride_d = take(g * sizeof(sm90_fp8::StrideD));
  l.a_scales = take(g * sizeof(const sm90_fp8::ElementScale*));
  l.b_scales = take(g * sizeof(const sm90_fp8::ElementScale*));
  l.a_scale_layouts = take(g * sizeof(sm90_fp8::LayoutSFA));
  l.b_scale_layouts = take(g * sizeof(sm90_fp8::LayoutSFB));
  l.cutlass = take(cutlass_bytes);
  l.total = at;
  return l;
}

sm90_fp8::GroupArrays carve(void* workspace, const WorkspaceLayout& l) {
  char* base = static_cast<char*>(workspace);
  sm90_fp8::GroupArrays arrays;
  arrays.shapes = reinterpret_cast<sm90_fp8::GroupShape*>(base + l.shapes);
  arrays.a = reinterpret_cast<const sm90_fp8::ElementAB**>(base + l.a);
  arrays.b = reinterpret_cast<const sm90_fp8::ElementAB**>(base + l.b);
  arrays.d = reinterpret_cast<void**>(base + l.d);
  arrays.stride_a = reinterpret_cast<sm90_fp8::StrideA*>(base + l.stride_a);
  arrays.stride_b = reinterpret_cast<sm90_fp8::StrideB*>(base + l.stride_b);
  arrays.stride_d = reinterpret_cast<sm90_fp8::StrideD*>(base + l.stride_d);
  arrays.a_scales = reinterpret_cast<const sm90_fp8::ElementScale**>(base + l.a_scales);
  arrays.b_scales = reinterpret_cast<const sm90_fp8::ElementScale**>(base + l.b_scales);
  arrays.a_scale_layouts = reinterpret_cast<sm90_fp8::LayoutSFA*>(base + l.a_scale_layouts);
  arrays.b_scale_layouts = reinterpret_cast<sm90_fp8::LayoutSFB*>(base + l.b_scale_layouts);
  return arrays;
}

struct SetupParams {
  const sm90_fp8::ElementAB* a;
  const float* a_scales;
  int a_scales_ld;
  const int32_t* expert_offsets;
  const sm90_fp8::ElementAB* b;
  const float* b_scales;
  int64_t b_scales_per_group;  // ceil(n/128) * (k/128)
  char* d;
  int d_bytes;  // bytes of one D element: 2 (bf16) or 4 (fp32)
  int num_groups;
  int n;
  int k;
  sm90_fp8::GroupArrays arrays;
};

// One block: group g gets its rows [offsets[g], offsets[g+1]) of A, D and the
// A scales (a column offset in the [k/128, a_scales_ld] scale array), and its
// expert's weights and weight scales. A group with no rows keeps M = 0 (see
// sm90_fp8_grouped_gemm_impl.cuh: the tile scheduler skips it).
__global__ void __launch_bounds__(kSetupThreads) fp8_grouped_gemm_setup_kernel(SetupParams p) {
  pdl_begin();
  for (int g = threadIdx.x; g < p.num_groups; g += blockDim.x) {
    const int32_t begin = p.expert_offsets[g];
    const int32_t rows = p.expert_offsets[g + 1] - begin;
    const int64_t n = p.n, k = p.k;
    p.arrays.shapes[g] = cute::make_shape(rows, p.n, p.k);
    p.arrays.a[g] = p.a + begin * k;
    p.arrays.b[g] = p.b + g * n * k;
    p.arrays.d[g] = p.d + begin * n * p.d_bytes;
    p.arrays.stride_a[g] = cute::make_stride(k, cute::Int<1>{}, cute::Int<0>{});
    p.arrays.stride_b[g] = cute::make_stride(k, cute::Int<1>{}, cute::Int<0>{});
    p.arrays.stride_d[g] = cute::make_stride(n, cute::Int<1>{}, cute::Int<0>{});
    p.arrays.a_scales[g] = p.a_scales + begin;
    p.arrays.b_scales[g] = p.b_scales + g * p.b_scales_per_group;
    p.arrays.a_scale_layouts[g] = sm90_fp8::a_scale_layout(rows, p.k, p.a_scales_ld);
    p.arrays.b_scale_layouts[g] = sm90_fp8::b_scale_layout(p.n, p.k);
  }
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("sm90 fp8 grouped GEMM: " + what);
}

bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

}  // namespace

std::size_t sm90_fp8_grouped_gemm_workspace_bytes(int num_groups, int sm_count) {
  require(num_groups >= 0 && sm_count > 0, "num_groups must be >= 0 and sm_count > 0");
  return workspace_layout(num_groups, sm_count).total;
}

void launch_sm90_fp8_grouped_gemm(const Sm90Fp8GroupedGemmParams& p, KernelStream stream) {
  constexpr int kBlock = sm90_fp8::kScaleBlock;
  require(p.num_groups >= 0, "num_groups is " + std::to_string(p.num_groups));
  // n: the TMA store needs D's rows 16-byte aligned (8 bf16 columns); the
  // contract's grain is 16.
  require(p.n > 0 && p.n % 16 == 0, "n must be a positive multiple of 16; got n=" +
                                        std::to_string(p.n));
  // k: whole scale blocks, so every K tile has its two scales.
  require(p.k > 0 && p.k % kBlock == 0, "k must be a positive multiple of " +
                                            std::to_string(kBlock) + "; got k=" +
                                            std::to_string(p.k));
  require(p.a_scales_ld > 0 && p.a_scales_ld % 4 == 0,
          "a_scales_ld must be a positive multiple of 4; got a_scales_ld=" +
              std::to_string(p.a_scales_ld));
  require(p.sm_count > 0, "sm_count must be positive");
  if (p.num_groups == 0) return;
  const std::pair<const void*, const char*> pointers[] = {
      {p.a, "a"}, {p.a_scales, "a_scales"}, {p.expert_offsets, "expert_offsets"}, {p.b, "b"},
      {p.b_scales, "b_scales"}, {p.workspace, "workspace"}};
  for (const auto& [ptr, name] : pointers) require(ptr != nullptr, std::string(name) + " is null");
  // TMA: 16-byte aligned bases (rows are, given n and k above); the scales
  // are read one float at a time.
  require(aligned(p.a, 16), "a must be 16-byte aligned");
  require(aligned(p.b, 16), "b must be 16-byte aligned");
  require((p.d != nullptr) != (p.d_f32 != nullptr), "give exactly one of d and d_f32");
  require(aligned(p.d, 16), "d must be 16-byte aligned");
  require(aligned(p.d_f32, 16), "d_f32 must be 16-byte aligned");
  require(aligned(p.a_scales, alignof(float)), "a_scales must be 4-byte aligned");
  require(aligned(p.b_scales, alignof(float)), "b_scales must be 4-byte aligned");
  require(aligned(p.workspace, kWorkspaceAlign), "workspace must be 256-byte aligned");
  const bool f32_out = p.d_f32 != nullptr;
  const sm90_fp8::TacticEntry& entry = tactic_entry(p.tactic, f32_out);

  const WorkspaceLayout layout = workspace_layout(p.num_groups, p.sm_count);
  SetupParams setup;
  setup.a = reinterpret_cast<const sm90_fp8::ElementAB*>(p.a);
  setup.a_scales = p.a_scales;
  setup.a_scales_ld = p.a_scales_ld;
  setup.expert_offsets = p.expert_offsets;
  setup.b = reinterpret_cast<const sm90_fp8::ElementAB*>(p.b);
  setup.b_scales = p.b_scales;
  setup.b_scales_per_group = static_cast<int64_t>(ceil_div(p.n, kBlock)) * (p.k / kBlock);
  setup.d = f32_out ? reinterpret_cast<char*>(p.d_f32) : reinterpret_cast<char*>(p.d);
  setup.d_bytes = f32_out ? 4 : 2;
  setup.num_groups = p.num_groups;
  setup.n = p.n;
  setup.k = p.k;
  setup.arrays = carve(p.workspace, layout);
  launch_pdl(fp8_grouped_gemm_setup_kernel, 1, kSetupThreads, 0, stream, setup);
  UNIMOE_LAUNCH_CHECK();

  entry.run(setup.arrays, p.num_groups, static_cast<char*>(p.workspace) + layout.cutlass,
            p.sm_count, stream.stream);
}

}  // namespace unimoe
