// The experts backends behind one interface (layer/experts_backend.h): each
// names its path, answers supports() with the plan's legality rule, sizes
// its own buffers, and the layer holds a backend's buffers only once some
// call may take it. The whole layer on every backend against the CPU
// reference: test_layer_gpu.cu and test_tuning_gpu.cu.
#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <string>

#include "gpu/gpu_test_util.h"
#include "kernels/gemm/sm90_grouped_gemm.cuh"
#include "backends/experts_backend.h"
#include "layer/moe_layer.h"
#include "support/presets.h"
#include "plan/tuning.h"

namespace unimoe {
namespace {

constexpr DeviceArch kH200Arch{9, 0, 132};

// Needs no device: making a backend allocates nothing.
TEST(ExpertsBackend, NamesItsPathAndAnswersWithThePlansRule) {
  const MoEConfig c = find_preset("qwen3-30b-a3b").config;
  const DeviceArch ampere{8, 0, 108};
  for (ExpertsPath p : kExpertsPaths) {
    const std::unique_ptr<ExpertsBackend> b = make_experts_backend(p, c, 64, kH200Arch.sm_count);
    EXPECT_EQ(b->path(), p);
    EXPECT_EQ(std::string(b->name()), path_name(p));
    EXPECT_EQ(b->supports(c, kH200Arch), "") << path_name(p);
    EXPECT_EQ(b->supports(c, ampere), backend_unsupported_reason(p, c, ampere));
    EXPECT_NE(b->supports(c, ampere), "") << path_name(p);
  }
}

// Needs no device: sizes only. Only the Cutlass path has buffers of its own:
// the gathered x rows and GEMM1's output for max_tokens * K rows, and the
// grouped GEMM's workspace.
TEST(ExpertsBackend, OnlyTheCutlassPathHasBuffersOfItsOwn) {
  const MoEConfig c = find_preset("qwen3-30b-a3b").config;
  const int max_tokens = 64;
  const std::size_t rows = std::size_t(max_tokens) * c.routing.top_k;
  for (ExpertsPath p : kExpertsPaths) {
    const std::unique_ptr<ExpertsBackend> b =
        make_experts_backend(p, c, max_tokens, kH200Arch.sm_count);
    if (p != ExpertsPath::Cutlass) {
      EXPECT_EQ(b->scratch_bytes(), 0u) << path_name(p);
      EXPECT_EQ(b->workspace_bytes(), 0u) << path_name(p);
      continue;
    }
    // Nothing is held before allocate_workspace.
    EXPECT_EQ(b->workspace_bytes(), 0u);
    EXPECT_GE(b->scratch_bytes(),
              rows * (c.experts.hidden + c.gemm1_cols()) * 2 +
                  sm90_grouped_gemm_workspace_bytes(c.local_experts(), kH200Arch.sm_count));
  }
}

TEST(ExpertsBackendGpu, LayerHoldsTheCutlassBuffersOnceATunedChoiceTakesThatPath) {
  UNIMOE_REQUIRE_GPU();
  const MoEConfig c = find_preset("dsv3-tp8").config;
  const int max_tokens = 8;
  MoELayerImpl layer(c, max_tokens, DevOverrides{});
  ASSERT_NE(plan_for_tokens(c, max_tokens).path, ExpertsPath::Cutlass);
  const std::size_t before = layer.workspace_bytes();
  TuningChoice choice;
  choice.path = ExpertsPath::Cutlass;
  layer.set_tuned(token_bucket(max_tokens), choice);
  const std::size_t cutlass =
      make_experts_backend(ExpertsPath::Cutlass, c, max_tokens, current_device_arch().sm_count)
          ->scratch_bytes();
  EXPECT_EQ(layer.workspace_bytes(), before + cutlass);
  // A second choice on the same path allocates nothing more.
  layer.set_tuned(token_bucket(1), choice);
  EXPECT_EQ(layer.workspace_bytes(), before + cutlass);
}

}  // namespace
}  // namespace unimoe
