// The CUTLASS side of sm90_fp8_grouped_gemm.cuh: operand and scale types, the
// per-group arrays that the setup kernel writes into the workspace, one
// tactic's kernel type, and its host launch. Each
// sm90_fp8_grouped_gemm_<tactic>.cu instantiates one tactic, so that each
// file compiles in bounded time.
//
// Zero-row groups: as in sm90_grouped_gemm_impl.cuh, the grouped tile
// scheduler gives a group ceil(M / BLK_M) * ceil(N / BLK_N) tiles, so M = 0
// gives none and the group is skipped; none of its pointers, scale pointers
// included, is dereferenced. The setup kernel writes M = 0 as is.
//
// How the blockwise collective
// (cutlass/gemm/collective/sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp)
// reads the scales, and what that asks of them:
//  - A producer warp of its own (the kernel's MainloopAux warp) copies, per
//    K tile, the tile's BLK_M A scales and its one B scale (BLK_N = 128 is one
//    N block) to shared memory with 4-byte cp.async, one float per copy: the
//    scale arrays need 4-byte alignment and nothing more.
//  - Each copy is predicated on its (row or N block, K block) coordinate lying
//    inside the scale layout's shape. The last M tile of a group whose row
//    count is not a multiple of BLK_M reads no scale at or past the group's M,
//    and a ragged last N tile reads B block ceil(n/128) - 1, no further. The
//    skipped shared-memory slots keep stale values, which only scale rows and
//    columns that the epilogue does not store.
//  - The consumers scale each BLK_K = 128 tile's wgmma sums by
//    a_scale(row) * b_scale and add them to the fp32 accumulators (CUTLASS's
//    GmmaFP8Accumulation, promotion every K tile).
//  - For grouped problems the collective does not read Arguments::layout_SFA
//    or layout_SFB: on every change of group, tensors_perform_update rebuilds
//    both layouts from the group's (M, N, K) with
//    ScaleConfig::tile_atom_to_shape_SFA/SFB. For MN-major A scales that
//    places K block kb of group g at kb * M_g: each group's scales packed
//    apart. Ours are one array over all rows with K block kb at
//    kb * a_scales_ld, so GroupScaleLayoutMainloop below reads the per-group
//    layouts that the setup kernel writes instead. (B's rebuilt layout equals
//    ours; it is read from the workspace too, so that both follow one rule.)
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/detail/layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernels/gemm/sm90_fp8_grouped_gemm.cuh"

namespace unimoe::sm90_fp8 {

using ElementAB = cutlass::float_e4m3_t;
using ElementAccumulator = float;
using ElementScale = float;  // the collective's ElementBlockScale: the accumulator type
using LayoutA = cutlass::layout::RowMajor;     // A [M, K]: K-major
using LayoutB = cutlass::layout::ColumnMajor;  // B (K, N) column-major = [N, K] row-major: K-major
using LayoutD = cutlass::layout::RowMajor;     // D [M, N]
// 16 bytes: the TMA's alignment of row starts and row strides.
inline constexpr int kAlignmentAB = 128 / cutlass::sizeof_bits<ElementAB>::value;
template <class Element>
inline constexpr int kAlignmentOf = 128 / cutlass::sizeof_bits<Element>::value;
// K depth of every scale, and N width of a B scale.
inline constexpr int kScaleBlock = 128;

// Scale granularity (M, N, K) = (1, 128, 128); A's scales MN-major (a K
// block's scales of consecutive rows are adjacent), B's K-major (an N block's
// scales of consecutive K blocks are adjacent).
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<
    1, kScaleBlock, kScaleBlock, cute::GMMA::Major::MN, cute::GMMA::Major::K>;
// ((_1,M),(_128,K/128),L) : ((_0,_1),(_0,ld),_) as a_scale_layout writes it
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
// ((_128,ceil(N/128)),(_128,K/128),L) : ((_0,K/128),(_0,_1),_)
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using GroupShape = ProblemShape::UnderlyingProblemShape;  // (M, N, K) of one group
using StrideA = cute::remove_pointer_t<cutlass::detail::TagToStrideA_t<LayoutA*>>;  // (K, _1, _0)
using StrideB = cute::remove_pointer_t<cutlass::detail::TagToStrideB_t<LayoutB*>>;  // (K, _1, _0)
using StrideD = cute::remove_pointer_t<cutlass::detail::TagToStrideC_t<LayoutD*>>;  // (N, _1, _0)

// Group g's A scales, from a_scales + offsets[g]: (row m, K block kb) at
// m + kb * ld for m < rows. One batch (L = 1), so the L stride is never used.
CUTLASS_HOST_DEVICE LayoutSFA a_scale_layout(int rows, int k, int ld) {
  using namespace cute;
  return make_layout(
      make_shape(make_shape(Int<1>{}, rows), make_shape(Int<kScaleBlock>{}, k / kScaleBlock), 1),
      make_stride(make_stride(Int<0>{}, Int<1>{}), make_stride(Int<0>{}, ld), 0));
}

// Group g's B scales, from b_scales + g * ceil(n/128) * (k/128): (N block nb,
// K block kb) at nb * (k/128) + kb, CUTLASS's own K-major layout. M plays no
// part in it.
CUTLASS_HOST_DEVICE LayoutSFB b_scale_layout(int n, int k) {
  return ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(0, n, k, 1));
}

// Per-group arguments of the CUTLASS kernel, in device memory; entry g
// describes group g.
struct GroupArrays {
  GroupShape* shapes = nullptr;
  const ElementAB** a = nullptr;
  const ElementAB** b = nullptr;
  void** d = nullptr;  // the kernel's ElementD*, bf16 or fp32 (the strides count elements)
  StrideA* stride_a = nullptr;
  StrideB* stride_b = nullptr;
  StrideD* stride_d = nullptr;
  const ElementScale** a_scales = nullptr;
  const ElementScale** b_scales = nullptr;
  LayoutSFA* a_scale_layouts = nullptr;
  LayoutSFB* b_scale_layouts = nullptr;
};

// CUTLASS's blockwise mainloop with one change: on a change of group, the
// scale tensors take the group's layouts from Arguments::layout_SFA/SFB (the
// workspace arrays) instead of layouts rebuilt from the group's shape (see
// the top of this file). Loads, predication and math are the base's.
template <class Base>
struct GroupScaleLayoutMainloop : Base {
  // The kernel's producer warps call this (through the kernel's
  // CollectiveMainloop type) with the group's (M, N, K, 1).
  template <class InputTensors, class ProblemShapeMNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const& /*previous*/,
                                                     typename Base::Params const& params,
                                                     ProblemShapeMNKL problem_shape_mnkl,
                                                     int32_t group) {
    // (BLK_M,BLK_K,m,k,l) and (BLK_N,BLK_K,n,k,l) TMA views of the group.
    const InputTensors views = Base::load_init(problem_shape_mnkl, params);
    return cute::make_tuple(
        cute::get<0>(views), cute::get<1>(views),
        cute::make_tensor(cute::make_gmem_ptr(params.ptr_SFA[group]),
                          params.layout_SFA[group]),   // ((1,M),(128,K/128),1)
        cute::make_tensor(cute::make_gmem_ptr(params.ptr_SFB[group]),
                          params.layout_SFB[group]));  // ((128,N/128),(128,K/128),1)
  }
};

// One tactic's kernel: a CUTLASS grouped GEMM with blockwise-scaled e4m3
// operands, fp32 accumulation, no source matrix C (beta 0) and a D of
// ElementOut (bf16, or fp32 for an output the next kernel quantizes), on
// clusters of ClusterShape (1x1, or 2x1: the two CTAs of a cluster take M
// tiles of one N tile and multicast its B tile; the grouped scheduler hands
// out tiles a cluster at a time, so a group's odd last M tile leaves the
// partner an empty tile, which loads and stores nothing).
template <class TileShape, class KernelSchedule, class EpilogueSchedule, class ElementOut,
          class ClusterShape_ = cute::Shape<cute::_1, cute::_1, cute::_1>>
struct Fp8GroupedGemm {
  using ElementD = ElementOut;
  static constexpr int kAlignmentD = kAlignmentOf<ElementD>;
  using ClusterShape = ClusterShape_;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutD*, kAlignmentD, ElementD, LayoutD*, kAlignmentD,
      EpilogueSchedule>::CollectiveOp;
  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementAB, cute::tuple<LayoutA*, LayoutSFA*>, kAlignmentAB,
      ElementAB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignmentAB,
      ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using CollectiveMainloop = GroupScaleLayoutMainloop<BuiltMainloop>;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // One K tile is one scale block, so every tile's sums are scaled once.
  static_assert(cute::size<2>(TileShape{}) == kScaleBlock);
  static_assert(cute::size<1>(TileShape{}) % kScaleBlock == 0);
  // The collective derives its scale config from the layouts we give it; it
  // must be ours, so that the setup kernel's layouts mean what it reads.
  static_assert(std::is_same_v<typename BuiltMainloop::ScaleConfig, ScaleConfig>);
  static_assert(std::is_same_v<typename BuiltMainloop::InternalLayoutSFA, LayoutSFA>);
  static_assert(std::is_same_v<typename BuiltMainloop::InternalLayoutSFB, LayoutSFB>);
  static_assert(std::is_same_v<typename BuiltMainloop::ElementBlockScale, ElementScale>);
  // The setup kernel writes GroupArrays; the kernel must read the same types.
  static_assert(std::is_same_v<typename Kernel::InternalStrideA, StrideA>);
  static_assert(std::is_same_v<typename Kernel::InternalStrideB, StrideB>);
  static_assert(std::is_same_v<typename Kernel::InternalStrideD, StrideD>);
  static_assert(std::is_same_v<typename Kernel::ElementA, ElementAB>);
  static_assert(std::is_same_v<typename Kernel::ElementD, ElementD>);
  // The stage count was chosen to fit; this keeps it so.
  static_assert(Kernel::SharedStorageSize <=
                cutlass::gemm::collective::detail::sm90_smem_capacity_bytes);

  // Problem shapes on the device only (host copy nullptr): the persistent
  // grid is sm_count CTAs, and CTAs without a tile exit at once.
  static typename Gemm::Arguments arguments(const GroupArrays& arrays, int num_groups,
                                            int sm_count) {
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {num_groups, arrays.shapes, nullptr};
    args.mainloop = {arrays.a,        arrays.stride_a, arrays.b, arrays.stride_b,
                     arrays.a_scales, arrays.a_scale_layouts,
                     arrays.b_scales, arrays.b_scale_layouts};
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
    args.epilogue.ptr_D = reinterpret_cast<ElementD**>(arrays.d);
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
      throw std::runtime_error(std::string("sm90 fp8 grouped GEMM: CUTLASS ") + what +
                               " failed: " + cutlassGetStatusString(status));
  }
};

template <class ElementOut>
using Cooperative128x128 =
    Fp8GroupedGemm<cute::Shape<cute::_128, cute::_128, cute::_128>,
                   cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                   cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, ElementOut>;
template <class ElementOut>
using Cooperative128x128Cluster2x1 =
    Fp8GroupedGemm<cute::Shape<cute::_128, cute::_128, cute::_128>,
                   cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                   cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, ElementOut,
                   cute::Shape<cute::_2, cute::_1, cute::_1>>;
template <class ElementOut>
using Pingpong64x128 =
    Fp8GroupedGemm<cute::Shape<cute::_64, cute::_128, cute::_128>,
                   cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                   cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong, ElementOut>;

// What the dispatcher needs of one tactic. Each tactic's entry is defined in
// its own file, sm90_fp8_grouped_gemm_<tactic>.cu, which holds its only
// instantiation.
struct TacticEntry {
  std::size_t (*workspace_bytes)(int num_groups, int sm_count);
  void (*run)(const GroupArrays& arrays, int num_groups, void* cutlass_workspace, int sm_count,
              cudaStream_t stream);
};

// Each tactic with a bf16 D and with an fp32 D.
extern const TacticEntry kCooperative128x128Entry;
extern const TacticEntry kCooperative128x128F32Entry;
extern const TacticEntry kPingpong64x128Entry;
extern const TacticEntry kPingpong64x128F32Entry;
extern const TacticEntry kCooperative128x128Cluster2x1Entry;
extern const TacticEntry kCooperative128x128Cluster2x1F32Entry;

}  // namespace unimoe::sm90_fp8
