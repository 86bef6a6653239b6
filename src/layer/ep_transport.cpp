// The EP transports (include/unimoe/ep.h): the loopback of ranks that share
// a process, and NCCL, loaded at run time.
#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common/common.cuh"
#include "layer/nccl_runtime.h"
#include "unimoe/ep.h"

namespace unimoe {

namespace {

// ------------------------------------------------------------- loopback ----

struct LoopbackHub {
  explicit LoopbackHub(int w) : posted(w), has(w, false) {}
  std::mutex mutex;
  std::vector<std::vector<EPTransport::Array>> posted;  // [rank] the arrays of its call
  std::vector<bool> has;
  int arrived = 0;
};

class LoopbackTransport final : public EPTransport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return int(hub_->posted.size()); }
  std::string name() const override { return "loopback"; }

  void all_to_all(const Array* arrays, int count, CUstream_st* stream) override {
    LoopbackHub& h = *hub_;
    std::lock_guard<std::mutex> lock(h.mutex);
    if (h.has[rank_])
      throw std::runtime_error("loopback transport: rank " + std::to_string(rank_) +
                               " started a second exchange before every rank made the first: run "
                               "each step on every rank in turn (EPLayer::run_step)");
    if (h.arrived > 0) {
      const auto& first = h.posted[first_posted(h)];
      bool same = int(first.size()) == count;
      for (int i = 0; same && i < count; ++i) same = first[i].chunk_bytes == arrays[i].chunk_bytes;
      if (!same)
        throw std::runtime_error("loopback transport: rank " + std::to_string(rank_) +
                                 "'s exchange has other chunk sizes than its peers'");
    }
    h.posted[rank_].assign(arrays, arrays + count);
    h.has[rank_] = true;
    if (++h.arrived < world_size()) return;
    // The last rank to arrive moves every chunk: rank s's chunk d lands in
    // rank d's chunk s.
    const int w = world_size();
    for (int i = 0; i < count; ++i) {
      const std::size_t bytes = h.posted[0][i].chunk_bytes;
      for (int d = 0; d < w && bytes > 0; ++d)
        for (int s = 0; s < w; ++s)
          UNIMOE_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(h.posted[d][i].recv) + s * bytes,
                                            static_cast<const char*>(h.posted[s][i].send) + d * bytes,
                                            bytes, cudaMemcpyDeviceToDevice, stream));
    }
    h.arrived = 0;
    h.has.assign(w, false);
  }

 private:
  static int first_posted(const LoopbackHub& h) {
    for (std::size_t r = 0; r < h.has.size(); ++r)
      if (h.has[r]) return int(r);
    return 0;
  }
  std::shared_ptr<LoopbackHub> hub_;
  int rank_;
};

// ----------------------------------------------------------------- NCCL ----

class NcclTransport final : public EPTransport {
 public:
  explicit NcclTransport(ncclComm* comm) : comm_(comm) {
    if (!comm) throw Error("comm", "is null; pass the communicator ncclCommInitRank made");
    rank_ = nccl::user_rank(comm);
    world_ = nccl::count(comm);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "nccl"; }
  void all_to_all(const Array* arrays, int count, CUstream_st* stream) override {
    nccl::grouped_all_to_all(comm_, arrays, count, world_, stream);
  }

 private:
  ncclComm* comm_;
  int rank_ = 0, world_ = 1;
};

}  // namespace

std::vector<std::unique_ptr<EPTransport>> make_loopback_transports(int world_size) {
  if (world_size < 1 || world_size > EPLayer::kMaxWorldSize)
    throw Error("ep.world_size", "is " + std::to_string(world_size) + "; allowed: 1.." +
                                     std::to_string(EPLayer::kMaxWorldSize));
  auto hub = std::make_shared<LoopbackHub>(world_size);
  std::vector<std::unique_ptr<EPTransport>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(std::make_unique<LoopbackTransport>(hub, r));
  return out;
}

std::unique_ptr<EPTransport> make_nccl_transport(ncclComm* comm) {
  const std::string why = nccl_support();
  if (!why.empty()) throw std::runtime_error("NCCL transport: " + why);
  return std::make_unique<NcclTransport>(comm);
}

std::string nccl_support() { return nccl::load_error(); }

}  // namespace unimoe
