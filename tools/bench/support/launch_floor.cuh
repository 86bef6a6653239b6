// The launch floor: a kernel that does only what every decode routing kernel
// does around its work (wait for the previous grid, let the next one launch,
// write to global memory), launched as they are (PDL, thread-block
// clusters). Timed back to back in a graph (`unimoe-bench --launch-floor`),
// it is the part of a routing call that no change to the routing itself can
// remove. Two fuller forms add the skeleton of a routing call's chain: one
// load of global memory written before the previous grid (the logits), then
// a barrier across the block, or across the cluster where there is one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/common.cuh"

namespace unimoe {

enum class FloorSteps {
  kEmpty,        // wait, trigger, one store
  kLoad,         // and every thread loads one float of `src` first
  kLoadBarrier,  // and a block (or cluster) barrier after the load
  // And, in clusters, a handoff to CTA 0 in place of the barrier: every
  // warp of the other CTAs arrives (release, cluster scope) on an mbarrier
  // in CTA 0's shared memory, which CTA 0 waits on (acquire); the mbarrier
  // is initialized behind a cluster barrier that every CTA arrives at
  // before its wait for the previous grid and waits at after the load.
  // Without clusters, as kLoadBarrier.
  kLoadHandoff,
  // As kLoadHandoff, but each of the other CTAs arrives once: a block
  // barrier after the load, then one thread arrives (the same handoff in
  // the cluster routing kernel, in place of its cluster barrier, measured
  // 1-7% slower there on an H200).
  kLoadCtaHandoff,
};

const char* floor_steps_name(FloorSteps steps);

// One launch of `ctas` CTAs of `threads` threads, as clusters of
// `cluster_ctas` CTAs (0: no cluster attribute; above 8 the non-portable
// size is allowed first). Thread 0 of CTA 0 writes ctas * threads to
// word[0], and a thread whose loaded value is not 0 writes it to word[1]
// (none, with `src` zeroed: that keeps the loads). `src` holds ctas *
// threads floats; kEmpty does not read it. Throws std::invalid_argument
// for a shape that is not a launch (ctas < 1, threads not a multiple of 32
// in 32..1024, ctas not whole clusters, a cluster above 16, a null pointer
// that is read, `steps` not a FloorSteps value) and std::runtime_error
// when the launch fails (a cluster the device cannot run, say).
void launch_floor_probe(FloorSteps steps, int ctas, int cluster_ctas, int threads, const float* src,
                        int32_t* word, KernelStream stream);

// Two kernels of about 130 KB of straight-line code each, two CTAs of
// 1,024 threads an SM (so every SM runs them), so that the next kernel on
// the stream finds none of its code in the SMs' instruction caches (L2
// still holds it), as a routing call does inside a model, where other
// kernels run between two layers' calls. Neither waits for the previous
// grid nor lets the next launch early. `sink` holds
// icache_evict_sink_floats(num_sms) floats (written, never meant to be
// read).
// For phase-stamp studies (unimoe-bench --routing-sweep --evict-icache;
// what such code costs, measured on an H200: straight-line code from L2 at
// about 2.2 cycles an instruction, 1.0 warm). Throws std::invalid_argument for num_sms < 1 or a null sink.
int icache_evict_sink_floats(int num_sms);
void launch_icache_evict(int num_sms, float* sink, cudaStream_t stream);

}  // namespace unimoe
