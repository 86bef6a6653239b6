// A handoff to one CTA of a thread-block cluster through an mbarrier in its
// shared memory (PTX: mbarrier, barrier.cluster, mapa), in place of a
// cluster barrier that every thread of every CTA arrives at and waits on.
//
// Two forms:
//   - arrivals (steps 1-4 below): the launch floor probe's handoff forms
//     (tools/bench/support/launch_floor.cu). In the cluster routing kernel,
//     one arrival a routing CTA in place of its cluster barrier measured 1-7%
//     slower on an H200 at T = 2..64: a remote arrival with
//     release semantics waits on a memory barrier, as the cluster barrier's
//     release does.
//   - transactions: the receiver arrives once on its own mbarrier
//     expecting a byte count (handoff_expect_bytes), the senders store
//     into its shared memory asynchronously (store_async_remote,
//     or_async_remote), each store completing its bytes, with no fence;
//     the receiver waits as in step 4. The cluster routing kernel's
//     overlapped way hands its staged rows to CTA 0 so (open_row_handoff in
//     fused_routing_kernels.cuh).
//
//   1. The receiving CTA's thread initializes the mbarrier with the number
//      of arrivals it waits for (handoff_init), then every thread of every
//      CTA arrives at the cluster barrier, relaxed (cluster_arrive_relaxed),
//      early: before its wait for the previous grid.
//   2. A sending CTA waits at that cluster barrier (cluster_wait) before its
//      first store into the receiver's shared memory: the mbarrier is then
//      initialized, and the receiver has started.
//   3. Having stored what it hands off (every thread of the CTA, then a
//      block barrier), one thread of the sender arrives on the mbarrier,
//      release at cluster scope (handoff_arrive_remote); the block barrier
//      orders the other threads' stores before that release.
//   4. The receiver's threads wait for the mbarrier's first phase, acquire
//      at cluster scope (handoff_wait), and then read what was handed off.
//
// A sender may exit once it has arrived: nothing reads its shared memory,
// and the receiver, whose shared memory the senders write, exits only after
// every arrival.
#pragma once

#include <cstdint>

namespace unimoe {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One thread of the receiving CTA, before cluster_arrive_relaxed.
__device__ __forceinline__ void handoff_init(uint64_t* bar, uint32_t count) {
  asm volatile(
      "mbarrier.init.shared::cta.b64 [%0], %1;\n"
      "fence.mbarrier_init.release.cluster;\n" ::"r"(smem_address(bar)),
      "r"(count)
      : "memory");
}

// Every thread of the warp executes these two (.aligned).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

// Arrives on the mbarrier at `bar`'s offset in CTA `rank`'s shared memory.
__device__ __forceinline__ void handoff_arrive_remote(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(rank)
      : "memory");
}

// The receiving thread's one arrival on its mbarrier at `bar`, expecting
// `bytes` of asynchronous stores (store_async_remote, or_async_remote)
// before the phase completes.
__device__ __forceinline__ void handoff_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)),
               "r"(bytes)
               : "memory");
}

// Every thread of the warp executes it (.aligned); release at cluster
// scope: the CTA's earlier shared-memory stores (and an mbarrier's
// initialization) before any other CTA's wait.
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}

// The shared::cluster address of `p` (this CTA's shared memory) in CTA
// `rank`'s shared memory.
__device__ __forceinline__ uint32_t cluster_address(const void* p, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(smem_address(p)), "r"(rank));
  return remote;
}

// An asynchronous store of one 32-bit word into another CTA's shared memory
// (`word` and `bar` from cluster_address), completing 4 bytes of the
// mbarrier's expected transactions: no fence, the mbarrier's phase makes it
// visible to the receiver's waiting threads.
__device__ __forceinline__ void store_async_remote(uint32_t word, uint32_t value, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(
                   word),
               "r"(value), "r"(bar)
               : "memory");
}

// The same as an asynchronous bitwise or into the word (4 bytes of
// transactions), for two senders that share a word.
__device__ __forceinline__ void or_async_remote(uint32_t word, uint32_t value, uint32_t bar) {
  asm volatile(
      "red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.or.b32 [%0], %1, "
      "[%2];\n" ::"r"(word),
      "r"(value), "r"(bar)
      : "memory");
}

// Until the mbarrier at `bar` (this CTA's) completes its first phase.
__device__ __forceinline__ void handoff_wait(uint64_t* bar) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "HANDOFF_WAIT:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], 0;\n"
      "@!done bra HANDOFF_WAIT;\n"
      "}\n" ::"r"(smem_address(bar))
      : "memory");
}

}  // namespace unimoe
