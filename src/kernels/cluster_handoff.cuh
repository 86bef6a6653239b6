// A handoff to one CTA of a thread-block cluster through an mbarrier in its
// shared memory (PTX: mbarrier, barrier.cluster, mapa), in place of a
// cluster barrier that every thread of every CTA arrives at and waits on.
// The launch floor probe's handoff forms use it (launch_floor.cu). In the
// cluster routing kernel, one arrival a routing CTA in place of its
// cluster barrier measured 1-7% slower on the H200 at T = 2..64 (session
// 26, bench/results/h200-routing-ab-session26.txt): the hardware barrier
// is not the cheaper one to replace there.
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
