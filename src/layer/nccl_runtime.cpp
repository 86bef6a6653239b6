#include "layer/nccl_runtime.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#if UNIMOE_HAVE_NCCL_H
#include <dlfcn.h>
#include <nccl.h>
#endif

namespace unimoe::nccl {

#if UNIMOE_HAVE_NCCL_H

namespace {

// The entry points used, resolved once.
struct Api {
  std::string error;  // empty when loaded
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommCount) comm_count = nullptr;
  decltype(&ncclCommUserRank) comm_user_rank = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
};

template <typename F>
bool resolve(void* handle, const char* name, F& f, std::string& error) {
  f = reinterpret_cast<F>(dlsym(handle, name));
  if (!f && error.empty()) error = std::string("libnccl.so.2 has no ") + name;
  return f != nullptr;
}

Api load() {
  Api a;
  // The copy already in the process (a framework's) first, so that the
  // caller's communicator and these calls share one NCCL.
  void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    const char* why = dlerror();
    a.error = std::string("cannot load libnccl.so.2 (") + (why ? why : "not found") +
              "); put the directory of the nvidia-nccl-cu13 wheel's nvidia/nccl/lib on LD_LIBRARY_PATH";
    return a;
  }
  resolve(h, "ncclGetVersion", a.get_version, a.error);
  resolve(h, "ncclGetErrorString", a.error_string, a.error);
  resolve(h, "ncclGetUniqueId", a.get_unique_id, a.error);
  resolve(h, "ncclCommInitRank", a.comm_init_rank, a.error);
  resolve(h, "ncclCommDestroy", a.comm_destroy, a.error);
  resolve(h, "ncclCommCount", a.comm_count, a.error);
  resolve(h, "ncclCommUserRank", a.comm_user_rank, a.error);
  resolve(h, "ncclGroupStart", a.group_start, a.error);
  resolve(h, "ncclGroupEnd", a.group_end, a.error);
  resolve(h, "ncclSend", a.send, a.error);
  resolve(h, "ncclRecv", a.recv, a.error);
  return a;
}

const Api& api() {
  static const Api a = load();
  if (!a.error.empty()) throw std::runtime_error("NCCL: " + a.error);
  return a;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw std::runtime_error(std::string("NCCL: ") + what + " failed: " + api().error_string(r));
}

}  // namespace

std::string load_error() {
  try {
    api();
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string version() {
  int v = 0;
  check(api().get_version(&v), "ncclGetVersion");
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z from 2.9 on.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

int user_rank(ncclComm* comm) {
  int r = 0;
  check(api().comm_user_rank(comm, &r), "ncclCommUserRank");
  return r;
}

int count(ncclComm* comm) {
  int n = 0;
  check(api().comm_count(comm, &n), "ncclCommCount");
  return n;
}

void grouped_all_to_all(ncclComm* comm, const EPTransport::Array* arrays, int n, int world,
                        cudaStream_t stream) {
  const Api& a = api();
  check(a.group_start(), "ncclGroupStart");
  for (int i = 0; i < n; ++i) {
    const std::size_t bytes = arrays[i].chunk_bytes;
    if (bytes == 0) continue;
    for (int d = 0; d < world; ++d) {
      check(a.send(static_cast<const char*>(arrays[i].send) + d * bytes, bytes, ncclUint8, d, comm, stream),
            "ncclSend");
      check(a.recv(static_cast<char*>(arrays[i].recv) + d * bytes, bytes, ncclUint8, d, comm, stream),
            "ncclRecv");
    }
  }
  check(a.group_end(), "ncclGroupEnd");
}

std::string unique_id() {
  ncclUniqueId id;
  check(api().get_unique_id(&id), "ncclGetUniqueId");
  return std::string(id.internal, sizeof(id.internal));
}

ncclComm* init_rank(const std::string& id_bytes, int world, int rank) {
  ncclUniqueId id;
  if (id_bytes.size() != sizeof(id.internal))
    throw std::runtime_error("NCCL: a unique id has " + std::to_string(sizeof(id.internal)) +
                             " bytes, not " + std::to_string(id_bytes.size()));
  std::copy(id_bytes.begin(), id_bytes.end(), id.internal);
  ncclComm_t comm = nullptr;
  check(api().comm_init_rank(&comm, world, id, rank), "ncclCommInitRank");
  return comm;
}

void destroy(ncclComm* comm) {
  if (comm) api().comm_destroy(comm);
}

#else  // built without NCCL's header

namespace {
const char* const kNoHeader =
    "this build has no NCCL support (no nccl.h at configure time: scripts/setup.sh fetches it "
    "into .deps/nccl)";
[[noreturn]] void fail() { throw std::runtime_error(std::string("NCCL: ") + kNoHeader); }
}  // namespace

std::string load_error() { return kNoHeader; }
std::string version() { fail(); }
int user_rank(ncclComm*) { fail(); }
int count(ncclComm*) { fail(); }
void grouped_all_to_all(ncclComm*, const EPTransport::Array*, int, int, cudaStream_t) { fail(); }
std::string unique_id() { fail(); }
ncclComm* init_rank(const std::string&, int, int) { fail(); }
void destroy(ncclComm*) {}

#endif

}  // namespace unimoe::nccl
