// NCCL, loaded at run time (dlopen of libnccl.so.2) so that the library
// needs NCCL only where expert parallelism over NCCL is used. Built with
// NCCL's header where the build found it (scripts/setup.sh fetches it from
// the nvidia-nccl-cu13 wheel into .deps/nccl); without it every call below
// but load_error throws std::runtime_error. Internal: not installed.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "unimoe/ep.h"

namespace unimoe::nccl {

// Empty when NCCL is usable in this process, else why not.
std::string load_error();
// "2.28.9": the loaded library's version.
std::string version();

int user_rank(ncclComm* comm);
int count(ncclComm* comm);

// One NCCL group of a send and a receive of every array's chunk with every
// rank (itself included): EPTransport::all_to_all over NCCL.
void grouped_all_to_all(ncclComm* comm, const EPTransport::Array* arrays, int count, int world,
                        cudaStream_t stream);

// For tools and tests that make their own group: a new unique id (its bytes),
// a communicator of `world` ranks from it on the current device, and its end.
std::string unique_id();
ncclComm* init_rank(const std::string& id, int world, int rank);
void destroy(ncclComm* comm);

}  // namespace unimoe::nccl
