// unimoe expert parallelism: the MoE layer with its experts spread over the
// ranks of a group (one GPU each), tokens moved to the ranks that hold their
// experts and the results moved back (docs/expert-parallel.md).
//
// A call on every rank, with that rank's own tokens:
//   dispatch  route this rank's tokens (or take the caller's ids and
//             weights) and pack, for each rank d, the tokens with at least
//             one expert on d: their x row, their K ids and K weights;
//   exchange  an all-to-all of the packed chunks (the transport);
//   experts   the local layer (MoELayer over this rank's E / world_size
//             experts) on every received token, with precomputed routing:
//             each received token gets the sum of w_k * expert_k(x) over its
//             experts on this rank;
//   return    an all-to-all of those partial sums back to the home ranks;
//   combine   each token's partial sums added in fp32 in rank order, the
//             sum rounded to bf16 once.
// The forward never synchronizes with the host and allocates nothing: chunks
// have a fixed size (max_tokens rows a rank pair, the worst case), so the
// whole call is captured in one CUDA graph and replayed for any routing.
//
// The header needs neither CUDA nor NCCL headers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "unimoe/unimoe.h"

struct ncclComm;  // ncclComm_t is ncclComm*

namespace unimoe {

// Moves fixed-size chunks between the ranks of a group. Implementations:
// make_nccl_transport (one process per GPU) and make_loopback_transports
// (every rank in one process, for tests and single-GPU checks).
class EPTransport {
 public:
  virtual ~EPTransport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;

  // One array of an all-to-all: chunk d of `send` (bytes [d * chunk_bytes,
  // (d + 1) * chunk_bytes)) goes to rank d; rank s's chunk for this rank
  // lands in chunk s of `recv`. Device memory.
  struct Array {
    const void* send = nullptr;
    void* recv = nullptr;
    std::size_t chunk_bytes = 0;
  };
  // Enqueues the all-to-all of `count` arrays on `stream` (every rank calls
  // it with the same chunk sizes). Capturable in a CUDA graph.
  virtual void all_to_all(const Array* arrays, int count, CUstream_st* stream) = 0;
};

// Over a communicator the caller made (ncclCommInitRank; one process per
// GPU, the communicator's device current). NCCL is loaded at run time:
// libnccl.so.2, the copy the process has loaded (PyTorch's, say) or else
// the one the dynamic loader finds (LD_LIBRARY_PATH). Throws
// std::runtime_error saying why when it cannot be loaded or this build has
// no NCCL support (nccl_support()).
std::unique_ptr<EPTransport> make_nccl_transport(ncclComm* comm);
// Empty when make_nccl_transport can work in this process, else why not.
std::string nccl_support();

// `world_size` ranks in one process on the current device. The ranks share
// one exchange: each rank's all_to_all records its arrays, and the call of
// the last rank to arrive copies every chunk, on that rank's stream. So a
// step of the call (EPLayer::run_step) must be made on every rank before
// the next step of any rank, all on one stream (or streams the caller
// orders); rank r of the result is transport r.
std::vector<std::unique_ptr<EPTransport>> make_loopback_transports(int world_size);

// The layer of one rank of an expert-parallel group.
class EPLayer {
 public:
  virtual ~EPLayer() = default;

  // config: the whole model's layer (routing over all E experts); its
  // experts.local_expert_offset and num_local_experts must be left at their
  // defaults: rank r serves experts [r * E / W, (r + 1) * E / W), and E must
  // be a multiple of the group size W (at most kMaxWorldSize).
  // max_tokens: the most tokens a rank passes to one call; every rank of
  // the group must use the same value. The transport must outlive the layer.
  // Throws Error naming the field for a bad config or group.
  static std::unique_ptr<EPLayer> create(const MoEConfig& config, int max_tokens,
                                         EPTransport& transport);
  static constexpr int kMaxWorldSize = 64;

  // Shared scratch, as MoELayer's (unimoe.h): the EP buffers and the local
  // layer's per-call buffers in one device buffer of the caller's, which
  // the EP layers of one model on this rank can share (one buffer a rank,
  // sized for the largest of their scratch_bytes). The same rules hold:
  // 256-byte aligned memory of the current device (Error naming `scratch`
  // otherwise), kept until the layers are gone, the layers created before
  // any forward that uses it is in flight (creating one zeroes part of it),
  // and their forwards run one after another. buffer_bytes() still gives
  // the EP buffers' size; the layer then holds none of it.
  // scratch_bytes: what create() below needs on a rank of a group of
  // world_size (the same on every rank); throws Error as create would for
  // a bad config, max_tokens or world_size.
  static std::size_t scratch_bytes(const MoEConfig& config, int max_tokens, int world_size);
  static std::unique_ptr<EPLayer> create(const MoEConfig& config, int max_tokens,
                                         EPTransport& transport, void* scratch,
                                         std::size_t scratch_size);

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int max_tokens() const = 0;
  // The layer over this rank's experts (its config has the rank's expert
  // range). Use it for autotune, use_tuning_cache and describe; its calls
  // see world_size * max_tokens tokens, most of them padding.
  virtual MoELayer& local_layer() = 0;
  // Device memory the EP buffers hold, besides the local layer's (in the
  // scratch, for a layer made with one).
  virtual std::size_t buffer_bytes() const = 0;
  // Bytes this rank sends a call (the fixed chunks, dispatch and return).
  virtual std::size_t bytes_sent_per_call() const = 0;

  // This rank's experts only: the ExpertWeights of MoELayer::set_weights for
  // E / W experts (the slice [r * E / W, (r + 1) * E / W) of the model's;
  // slice_experts makes it). FP8PerTensor needs its static activation
  // scales (x_scale, act_scale): dynamic ones would be taken over the rows
  // a rank receives, padding included (Error, field "weights.x_scale").
  virtual void set_weights(const ExpertWeights& weights) = 0;

  // One call: args as for MoELayer::forward, with this rank's tokens
  // (num_tokens <= max_tokens; may differ between ranks). out receives each
  // token's output. Every rank of the group must call it (the exchanges
  // are collective).
  virtual void forward(const ForwardArgs& args, CUstream_st* stream) = 0;

  // The steps of forward, in order, for transports whose ranks share a
  // process (make_loopback_transports) and for timing each step.
  enum class Step { Dispatch, Exchange, Experts, Return, Combine };
  virtual void run_step(Step step, const ForwardArgs& args, CUstream_st* stream) = 0;
};

// The steps of a call in order, as forward runs them.
inline constexpr EPLayer::Step kEPSteps[] = {EPLayer::Step::Dispatch, EPLayer::Step::Exchange,
                                             EPLayer::Step::Experts, EPLayer::Step::Return,
                                             EPLayer::Step::Combine};
const char* ep_step_name(EPLayer::Step step);

// The ExpertWeights of experts [first, first + count) of a model's weights
// `all` (every array in ExpertWeights' layout for all E experts of
// `config`, whose expert range must be the default): pointers into the same
// arrays, no copy. Per-matrix scalars shared by every expert (FP8PerTensor's
// x_scale and act_scale) and w13_interleaved are kept. The scale arrays'
// slices start wherever the expert does (set_weights needs 4-byte alignment
// of fp32 scales only); a slice of w13, w2 or the biases off 16-byte
// alignment, which set_weights refuses naming the field, needs expert sizes
// no preset has. Throws Error (field "first" or "count") for a range
// outside [0, E).
ExpertWeights slice_experts(const ExpertWeights& all, const MoEConfig& config, int first, int count);

}  // namespace unimoe
