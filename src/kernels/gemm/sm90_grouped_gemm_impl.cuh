// The CUTLASS side of sm90_grouped_gemm.cuh: operand types, the per-group
// arrays that the setup kernel writes into the workspace, one tactic's kernel
// type, and its host launch. Each sm90_grouped_gemm_<tactic>.cu instantiates
// one tactic, so that each file compiles in bounded time.
//
// Zero-row groups: CUTLASS's grouped tile scheduler
// (PersistentTileSchedulerSm90Group) gives a group ceil(M / BLK_M) *
// ceil(N / BLK_N) tiles, so M = 0 gives none and the group is skipped; its
// TMA descriptors are never built, and its pointer (one past the previous
// group's rows) is never dereferenced. The setup kernel writes M = 0 as is.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernels/gemm/sm90_grouped_gemm.cuh"

namespace unimoe::sm90 {

using ElementAB = cutlass::bfloat16_t;
using ElementD = cutlass::bfloat16_t;
using ElementAccumulator = float;
using LayoutA = cutlass::layout::RowMajor;     // A [M, K]: K-major
using LayoutB = cutlass::layout::ColumnMajor;  // B (K, N) column-major = [N, K] row-major: K-major
using LayoutD = cutlass::layout::RowMajor;     // D [M, N]
// 16 bytes: the TMA's alignment of row starts and row strides.
inline constexpr int kAlignment = 128 / cutlass::sizeof_bits<ElementAB>::value;

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using GroupShape = ProblemShape::UnderlyingProblemShape;  // (M, N, K) of one group
using StrideA = cute::remove_pointer_t<cutlass::detail::TagToStrideA_t<LayoutA*>>;  // (K, _1, _0)
using StrideB = cute::remove_pointer_t<cutlass::detail::TagToStrideB_t<LayoutB*>>;  // (K, _1, _0)
using StrideD = cute::remove_pointer_t<cutlass::detail::TagToStrideC_t<LayoutD*>>;  // (N, _1, _0)

// Per-group arguments of the CUTLASS kernel, in device memory; entry g
// describes group g.
struct GroupArrays {
  GroupShape* shapes = nullptr;
  const ElementAB** a = nullptr;
  const ElementAB** b = nullptr;
  ElementD** d = nullptr;
  StrideA* stride_a = nullptr;
  StrideB* stride_b = nullptr;
  StrideD* stride_d = nullptr;
};

// One tactic's kernel: a CUTLASS grouped GEMM with cluster 1x1, fp32
// accumulation, no source matrix C (beta 0) and a bf16 D.
template <class TileShape, class KernelSchedule, class EpilogueSchedule>
struct GroupedGemm {
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutD*, kAlignment, ElementD, LayoutD*, kAlignment,
      EpilogueSchedule>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA*, kAlignment,
      ElementAB, LayoutB*, kAlignment, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // The setup kernel writes GroupArrays; the kernel must read the same types.
  static_assert(std::is_same_v<typename Kernel::InternalStrideA, StrideA>);
  static_assert(std::is_same_v<typename Kernel::InternalStrideB, StrideB>);
  static_assert(std::is_same_v<typename Kernel::InternalStrideD, StrideD>);
  static_assert(std::is_same_v<typename Kernel::ElementA, ElementAB>);
  static_assert(std::is_same_v<typename Kernel::ElementD, ElementD>);

  // Problem shapes on the device only (host copy nullptr): the persistent
  // grid is sm_count CTAs, and CTAs without a tile exit at once.
  static typename Gemm::Arguments arguments(const GroupArrays& arrays, int num_groups,
                                            int sm_count) {
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {num_groups, arrays.shapes, nullptr};
    args.mainloop = {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b};
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
    args.epilogue.ptr_D = arrays.d;
    args.epilogue.dD = arrays.stride_d;
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.hw_info.sm_count = sm_count;
    return args;
  }

  // Depends on (num_groups, sm_count) only: per-SM TMA descriptors.
  static std::size_t workspace_bytes(int num_groups, int sm_count) {
    return Gemm::get_workspace_size(arguments(GroupArrays{}, num_groups, sm_count));
  }

  // Host work only (arguments, TMA descriptor templates, the kernel's
  // shared-memory attribute) and one kernel launch on `stream`.
  static void run(const GroupArrays& arrays, int num_groups, void* cutlass_workspace,
                  int sm_count, cudaStream_t stream) {
    const typename Gemm::Arguments args = arguments(arrays, num_groups, sm_count);
    Gemm gemm;
    check(gemm.can_implement(args), "can_implement");
    check(gemm.initialize(args, cutlass_workspace, stream), "initialize");
    check(gemm.run(stream), "run");
  }

 private:
  static void check(cutlass::Status status, const char* what) {
    if (status != cutlass::Status::kSuccess)
      throw std::runtime_error(std::string("sm90 grouped GEMM: CUTLASS ") + what + " failed: " +
                               cutlassGetStatusString(status));
  }
};

using Cooperative128x128 =
    GroupedGemm<cute::Shape<cute::_128, cute::_128, cute::_64>,
                cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
using Cooperative128x256 =
    GroupedGemm<cute::Shape<cute::_128, cute::_256, cute::_64>,
                cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
using Pingpong64x128 =
    GroupedGemm<cute::Shape<cute::_64, cute::_128, cute::_64>,
                cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;

// What the dispatcher needs of one tactic. Each tactic's entry is defined in
// its own file, sm90_grouped_gemm_<tactic>.cu, which holds its only
// instantiation.
struct TacticEntry {
  std::size_t (*workspace_bytes)(int num_groups, int sm_count);
  void (*run)(const GroupArrays& arrays, int num_groups, void* cutlass_workspace, int sm_count,
              cudaStream_t stream);
};

extern const TacticEntry kCooperative128x128Entry;
extern const TacticEntry kCooperative128x256Entry;
extern const TacticEntry kPingpong64x128Entry;

}  // namespace unimoe::sm90
