// The experts stages behind one interface. A backend runs GEMM1 (with the
// activation) and GEMM2 of the BF16 experts over the layer's routing result
// and says what the finalize must add; the layer owns routing, permute, the
// finalize and every buffer of ExpertsCall.
//
// Contract between the layer and a backend:
//   - supports(config, arch): empty, or the rule that failed (the rules are
//     host code in plan/layer_plan.cpp, backend_unsupported_reason, which the
//     tuner and the CPU tests use too);
//   - prepare_weights(w): once per set_weights, after the layer's checks
//     (set, 16-byte aligned, biases iff has_bias); the backend keeps its own
//     layout of the weights;
//   - allocate_workspace(scratch): once, before the first run and never
//     during capture. The backend's per-call buffers (scratch_bytes()) go
//     into `scratch` when the layer gives one (a caller's scratch that
//     layers of a model share: nothing in it outlives a forward) or into an
//     allocation of its own when it is null; what must persist between
//     calls (FP8PerTensor's expanded weight scales) is always its own.
//     workspace_bytes() is what it then holds itself;
//   - run_gemm1 reads x, the routing result and the tile schedule and writes
//     the activated intermediate (BF16: the layer's act [T*K, I]; FP8: the
//     backend's own e4m3 codes and scales); run_gemm2 reads it and writes
//     y [T*K, H], both in permuted row order; no allocation, no host sync;
//   - finalize_b2(): the b2 the finalize adds (weight * b2[expert] per row)
//     when GEMM2 has no bias epilogue; the finalize applies the routing
//     weights on every path;
//   - folds_finalize(): whether run_gemm2 can take ExpertsCall::fold and
//     write the layer's output itself (the FP8 and 4-bit stream paths).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/gemm/grouped_gemm.cuh"
#include "kernels/permute/permute.cuh"
#include "plan/layer_plan.h"
#include "unimoe/unimoe.h"

namespace unimoe {

// The per-call inputs and outputs of the experts stages, all in the layer's
// workspace except x.
struct ExpertsCall {
  const uint16_t* x = nullptr;                    // [T, H] bf16
  int num_tokens = 0;                             // T
  const int32_t* permuted_to_expanded = nullptr;  // [T*K]: row r is expanded row p2e[r]
  const int32_t* expanded_to_permuted = nullptr;  // [T*K]: its inverse, -1 off this rank
  const int32_t* expert_offsets = nullptr;        // [E_local + 1] device, exclusive scan
  const DeviceTile* tiles = nullptr;              // schedule for the plan's tile_m
  const int32_t* num_tiles = nullptr;             // device count
  int max_tiles = 0;                              // capacity of tiles (sizes the grids)
  uint16_t* act = nullptr;                        // [T*K, I] bf16: GEMM1 output
  uint16_t* y = nullptr;                          // [T*K, H] bf16: GEMM2 output
  // counters set: run_gemm2 folds the finalize (the layer then launches no
  // finalize kernel); only for a backend whose folds_finalize() is true.
  FinalizeFold fold;
};

class ExpertsBackend {
 public:
  virtual ~ExpertsBackend() = default;
  ExpertsBackend(const ExpertsBackend&) = delete;
  ExpertsBackend& operator=(const ExpertsBackend&) = delete;

  ExpertsPath path() const { return path_; }
  const char* name() const { return path_name(path_); }
  // Empty when this backend can serve `config` on `arch`, else the reason.
  std::string supports(const MoEConfig& config, const DeviceArch& arch) const {
    return backend_unsupported_reason(path_, config, arch);
  }

  virtual void prepare_weights(const ExpertWeights& weights) = 0;
  // Device bytes of the per-call buffers (sized from the config and
  // max_tokens given to make_experts_backend), a multiple of 256.
  virtual std::size_t scratch_bytes() const = 0;
  // Device bytes the backend holds itself once allocate_workspace ran: its
  // persistent buffers, and its scratch where the layer gave none.
  virtual std::size_t workspace_bytes() const = 0;
  // Places the per-call buffers at `scratch` (256-byte aligned,
  // scratch_bytes() long) or, for null, in an allocation of its own, and
  // allocates the persistent ones; a second call does nothing. Not during
  // capture.
  virtual void allocate_workspace(char* scratch) = 0;

  virtual void run_gemm1(const ExpertsCall& call, const LayerPlan& plan, cudaStream_t stream) = 0;
  virtual void run_gemm2(const ExpertsCall& call, const LayerPlan& plan, cudaStream_t stream) = 0;
  virtual const float* finalize_b2() const = 0;
  virtual bool folds_finalize() const { return false; }
  // FP8PerTensor with dynamic scales: the device address of the two scales
  // the last forward computed (x's, then the activation's), which a partial
  // reference check needs (the scale is one amax over every row of the
  // call). nullptr for every other variant.
  virtual const float* dynamic_activation_scales() const { return nullptr; }

 protected:
  explicit ExpertsBackend(ExpertsPath path) : path_(path) {}

 private:
  ExpertsPath path_;
};

// The backend of path `p` for `config`, serving calls of up to `max_tokens`
// tokens on a device of `sm_count` SMs. Allocates nothing. For a config no
// backend of `p` serves (the Mma path and FP8), one whose supports() says why.
std::unique_ptr<ExpertsBackend> make_experts_backend(ExpertsPath p, const MoEConfig& config,
                                                     int max_tokens, int sm_count);
// The FP8 backends (backends/fp8_backends.cu): the Stream and Cutlass paths
// for FP8Block128 and FP8PerTensor; nullptr for the Mma path.
std::unique_ptr<ExpertsBackend> make_fp8_experts_backend(ExpertsPath p, const MoEConfig& config,
                                                         int max_tokens, int sm_count);
// The W4A16 backend (backends/w4_backends.cu) for MXFP4 and NVFP4: the
// Stream path; nullptr for the others.
std::unique_ptr<ExpertsBackend> make_w4_experts_backend(ExpertsPath p, const MoEConfig& config);

}  // namespace unimoe
