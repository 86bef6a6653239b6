// The sm90 grouped GEMM's workspace layout, setup kernel and dispatch
// (contract: sm90_grouped_gemm.cuh). The CUTLASS kernels live in
// sm90_grouped_gemm_<tactic>.cu, one instantiation each; the tactics' names
// live with the host plan (plan/tactics.cpp).
#include <algorithm>
#include <stdexcept>

#include "kernels/common/common.cuh"
#include "kernels/gemm/sm90_grouped_gemm.cuh"
#include "kernels/gemm/sm90_grouped_gemm_impl.cuh"

namespace unimoe {
namespace {

constexpr int kSetupThreads = 256;
// Every part of the workspace starts on this boundary (cudaMalloc's), which
// covers the TMA descriptors' 64 bytes and the 16 of everything else.
constexpr std::size_t kWorkspaceAlign = 256;

const sm90::TacticEntry& tactic_entry(Sm90GemmTactic t) {
  switch (t) {
    case Sm90GemmTactic::Cooperative128x128:
      return sm90::kCooperative128x128Entry;
    case Sm90GemmTactic::Cooperative128x256:
      return sm90::kCooperative128x256Entry;
    case Sm90GemmTactic::Pingpong64x128:
      return sm90::kPingpong64x128Entry;
  }
  throw std::invalid_argument("sm90 grouped GEMM: unknown tactic " +
                              std::to_string(static_cast<int>(t)));
}

std::size_t align_up(std::size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// Byte offsets of the workspace parts: the per-group arrays, then the CUTLASS
// workspace (sized for the largest tactic, so one workspace serves all).
struct WorkspaceLayout {
  std::size_t shapes = 0, a = 0, b = 0, d = 0, stride_a = 0, stride_b = 0, stride_d = 0;
  std::size_t cutlass = 0;
  std::size_t total = 0;
};

WorkspaceLayout workspace_layout(int num_groups, int sm_count) {
  const std::size_t g = static_cast<std::size_t>(num_groups);
  std::size_t cutlass_bytes = 0;
  for (Sm90GemmTactic t : kSm90GemmTactics)
    cutlass_bytes = std::max(cutlass_bytes, tactic_entry(t).workspace_bytes(num_groups, sm_count));
  WorkspaceLayout l;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t offset = at;
    at = align_up(at + bytes);
    return offset;
  };
  l.shapes = take(g * sizeof(sm90::GroupShape));
  l.a = take(g * sizeof(const sm90::ElementAB*));
  l.b = take(g * sizeof(const sm90::ElementAB*));
  l.d = take(g * sizeof(sm90::ElementD*));
  l.stride_a = take(g * sizeof(sm90::StrideA));
  l.stride_b = take(g * sizeof(sm90::StrideB));
  l.stride_d = take(g * sizeof(sm90::StrideD));
  l.cutlass = take(cutlass_bytes);
  l.total = at;
  return l;
}

sm90::GroupArrays carve(void* workspace, const WorkspaceLayout& l) {
  char* base = static_cast<char*>(workspace);
  sm90::GroupArrays arrays;
  arrays.shapes = reinterpret_cast<sm90::GroupShape*>(base + l.shapes);
  arrays.a = reinterpret_cast<const sm90::ElementAB**>(base + l.a);
  arrays.b = reinterpret_cast<const sm90::ElementAB**>(base + l.b);
  arrays.d = reinterpret_cast<sm90::ElementD**>(base + l.d);
  arrays.stride_a = reinterpret_cast<sm90::StrideA*>(base + l.stride_a);
  arrays.stride_b = reinterpret_cast<sm90::StrideB*>(base + l.stride_b);
  arrays.stride_d = reinterpret_cast<sm90::StrideD*>(base + l.stride_d);
  return arrays;
}

struct SetupParams {
  const sm90::ElementAB* a;
  const int32_t* expert_offsets;
  const sm90::ElementAB* b;
  sm90::ElementD* d;
  int num_groups;
  int n;
  int k;
  sm90::GroupArrays arrays;
};

// One block: group g gets its rows [offsets[g], offsets[g+1]) of A and D and
// its expert's weights. A group with no rows keeps M = 0 (see
// sm90_grouped_gemm_impl.cuh: the tile scheduler skips it).
__global__ void __launch_bounds__(kSetupThreads) grouped_gemm_setup_kernel(SetupParams p) {
  pdl_begin();
  for (int g = threadIdx.x; g < p.num_groups; g += blockDim.x) {
    const int32_t begin = p.expert_offsets[g];
    const int32_t rows = p.expert_offsets[g + 1] - begin;
    const int64_t n = p.n, k = p.k;
    p.arrays.shapes[g] = cute::make_shape(rows, p.n, p.k);
    p.arrays.a[g] = p.a + begin * k;
    p.arrays.b[g] = p.b + g * n * k;
    p.arrays.d[g] = p.d + begin * n;
    p.arrays.stride_a[g] = cute::make_stride(k, cute::Int<1>{}, cute::Int<0>{});
    p.arrays.stride_b[g] = cute::make_stride(k, cute::Int<1>{}, cute::Int<0>{});
    p.arrays.stride_d[g] = cute::make_stride(n, cute::Int<1>{}, cute::Int<0>{});
  }
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("sm90 grouped GEMM: " + what);
}

bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

}  // namespace

const Sm90GemmTactic* sm90_gemm_tactics(int* count) {
  *count = kNumSm90GemmTactics;
  return kSm90GemmTactics;
}

std::size_t sm90_grouped_gemm_workspace_bytes(int num_groups, int sm_count) {
  require(num_groups >= 0 && sm_count > 0, "num_groups must be >= 0 and sm_count > 0");
  return workspace_layout(num_groups, sm_count).total;
}

void launch_sm90_grouped_gemm(const Sm90GroupedGemmParams& p, KernelStream stream) {
  require(p.num_groups >= 0, "num_groups is " + std::to_string(p.num_groups));
  require(p.n > 0 && p.n % sm90::kAlignment == 0 && p.k > 0 && p.k % sm90::kAlignment == 0,
          "n and k must be positive multiples of " + std::to_string(sm90::kAlignment) +
              " (TMA rows are 16-byte aligned); got n=" + std::to_string(p.n) +
              " k=" + std::to_string(p.k));
  require(p.sm_count > 0, "sm_count must be positive");
  if (p.num_groups == 0) return;
  require(p.a && p.b && p.d && p.expert_offsets && p.workspace, "a null pointer");
  require(aligned(p.a, 16) && aligned(p.b, 16) && aligned(p.d, 16),
          "a, b and d must be 16-byte aligned");
  require(aligned(p.workspace, kWorkspaceAlign), "the workspace must be 256-byte aligned");
  const sm90::TacticEntry& entry = tactic_entry(p.tactic);

  const WorkspaceLayout layout = workspace_layout(p.num_groups, p.sm_count);
  SetupParams setup;
  setup.a = reinterpret_cast<const sm90::ElementAB*>(p.a);
  setup.expert_offsets = p.expert_offsets;
  setup.b = reinterpret_cast<const sm90::ElementAB*>(p.b);
  setup.d = reinterpret_cast<sm90::ElementD*>(p.d);
  setup.num_groups = p.num_groups;
  setup.n = p.n;
  setup.k = p.k;
  setup.arrays = carve(p.workspace, layout);
  launch_pdl(grouped_gemm_setup_kernel, 1, kSetupThreads, 0, stream, setup);
  UNIMOE_LAUNCH_CHECK();

  entry.run(setup.arrays, p.num_groups, static_cast<char*>(p.workspace) + layout.cutlass,
            p.sm_count, stream.stream);
}

}  // namespace unimoe
