// The host half of the autotuner: token buckets, the tuning choice and its
// text form, the JSON cache of winners, and the tuner that picks a winner
// from candidates with an injected timer and reference check. Pure host
// code, tested on the CPU (tests/cpu/test_tuning.cpp); docs/tuning.md says
// what the files hold and what is not wired yet.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "plan/layer_plan.h"
#include "core/tactics.h"
#include "unimoe/unimoe.h"

namespace unimoe {

// ---------------------------------------------------------------- buckets ----

// The largest bucket. Calls above it share its winner: tuning at 16384
// tokens already fills every SM many times over, so larger calls are not
// expected to change the winner, and timing them would cost more.
inline constexpr int kMaxTokenBucket = 16384;

// The representative T of the bucket serving a call of `num_tokens`: the
// smallest power of two >= num_tokens, capped at kMaxTokenBucket. 0 tokens
// take bucket 1 (the layer plans an empty call as T = 1). Throws Error
// (field "num_tokens") when negative.
int token_bucket(int num_tokens);
// Throws Error (field "bucket") unless `bucket` is one: token_bucket(b) == b, b >= 1.
void check_token_bucket(int bucket);
// Every bucket up to token_bucket(max_tokens): 1, 2, 4, ...
std::vector<int> token_buckets(int max_tokens);

// ----------------------------------------------------------------- choice ----

// One candidate, or a winner with its measured time. Both paths' fields are
// always set and printed, so that every choice has one text form; the path
// that does not run ignores the other's fields.
struct TuningChoice {
  ExpertsPath path = ExpertsPath::Mma;
  GemmTactic gemm1;  // Mma path: GEMM1 tactic; Stream path: the stream tactic
  GemmTactic gemm2;  // Mma path: GEMM2 tactic (same tile_m as gemm1); Stream: as gemm1
  Sm90GemmTactic sm90 = Sm90GemmTactic::Cooperative128x128;  // Cutlass path
  double time_us = 0;  // measured layer time; 0 for an untimed candidate

  // "path=mma gemm1=m16n64 gemm2=m16n128 sm90=coop_128x128x64 time_us=67.8";
  // time_us prints in the shortest form that parses back to the same double.
  std::string to_string() const;
  // Every key exactly once, in any order. Throws Error (field
  // "tuning_choice", or that of the bad tactic or path) on anything else.
  static TuningChoice parse(const std::string& s);
};

bool operator==(const TuningChoice& a, const TuningChoice& b);
inline bool operator!=(const TuningChoice& a, const TuningChoice& b) { return !(a == b); }

// Every candidate for `config` at token bucket `bucket` (checked to be a
// bucket) on a device of `arch`, backends that cannot serve left out
// (backend_unsupported_reason): on the Mma path each (gemm1, gemm2) pair of
// compiled tiled tactics with the same tile_m, in kMmaTactics order; on the
// Stream path the stream tactic; on the Cutlass path each compiled sm90
// tactic. A forced options.backend lists only that path. Every compiled
// tactic is a candidate at every bucket so far: the tuner, not a rule,
// rejects the slow ones. The wgmma kernels (the BF16 wgmma tactics, FP8's
// mma path) are listed only with `offer_wgmma` (the development knob
// tune_wgmma): slower than the cutlass path on an H100.
std::vector<TuningChoice> candidates_for(const MoEConfig& config, int bucket,
                                         const DeviceArch& arch, bool offer_wgmma = false);

// ------------------------------------------------------------------- keys ----

// What a timing depends on besides the config. Results from another GPU,
// SM count (a MIG slice, a cut-down part), CUDA or unimoe version are not used.
struct TuningDevice {
  std::string gpu_name;  // cudaDeviceProp::name, e.g. "NVIDIA H200"
  int sm_count = 0;
  int cuda_version = 0;  // CUDART_VERSION, e.g. 13000
  std::string unimoe_version = kVersion;

  // "NVIDIA H200 (132 SMs, CUDA 13000, unimoe 0.1.0)"
  std::string to_string() const;
  // The fields of `other` that differ from this one's, e.g. "SM count, CUDA
  // version"; empty when the same device.
  std::string differences(const TuningDevice& other) const;
};

bool operator==(const TuningDevice& a, const TuningDevice& b);

// The cache key of a config on a device. config is MoEConfig::to_string()
// with options.backend "auto": the backend option restricts the candidates,
// it does not change the problem. So a layer with a forced backend must not
// write its restricted winner into a shared cache, and must not pass a
// winner of the other path to plan_for_tokens (which refuses it).
struct TuningKey {
  TuningDevice device;
  std::string config;

  static TuningKey make(const TuningDevice& device, const MoEConfig& config);
};

// ------------------------------------------------------------------ cache ----

// Winners per (key, bucket), kept in a JSON file (docs/tuning.md has an
// example). A cache serves one device: entries for other devices survive a
// load and save unchanged but are never found. (Implemented in tuning_cache.cpp.)
class TuningCache {
 public:
  // An empty cache for `device`.
  explicit TuningCache(TuningDevice device);

  // The entries of the file at `path` (an empty cache when there is none).
  // Entries for a device other than `device` are kept out of find(), with
  // one message per such device (messages()). Throws Error (field
  // "tuning_cache") naming the file when it cannot be read or parsed, has
  // another format, or holds a malformed entry.
  static TuningCache load(const std::string& path, const TuningDevice& device);
  // Writes every entry (this device's and the others') to `path`, through a
  // temporary file renamed over it so that a reader never sees half a file.
  // Creates missing parent directories. Throws Error (field "tuning_cache")
  // when it cannot.
  void save(const std::string& path) const;

  std::optional<TuningChoice> find(const TuningKey& key, int bucket) const;
  // Adds or replaces the entry. Throws Error when `bucket` is not a bucket
  // (field "bucket") or key.device is not this cache's ("tuning_cache").
  void put(const TuningKey& key, int bucket, const TuningChoice& choice);

  const TuningDevice& device() const { return device_; }
  // Entries that find() can return.
  std::size_t size() const { return entries_.size(); }
  // One line per other device found in the loaded file, e.g. "tuning cache
  // /x.json: 12 entries are for NVIDIA H100 (132 SMs, CUDA 12080, unimoe
  // 0.1.0); this is NVIDIA H200 (...): not used (differs: GPU name)".
  const std::vector<std::string>& messages() const { return messages_; }

 private:
  // (gpu name, SM count, CUDA version, unimoe version, config, bucket).
  using Slot = std::tuple<std::string, int, int, std::string, std::string, int>;
  static Slot slot(const TuningKey& key, int bucket);

  TuningDevice device_;
  std::map<Slot, TuningChoice> entries_;  // found by find()
  std::map<Slot, TuningChoice> others_;   // other devices': written back by save()
  std::vector<std::string> messages_;
};

// ------------------------------------------------------------------ tuner ----

// Picks the fastest candidate that passes the reference check. The GPU
// layer supplies the timer and the check; tests inject their own.
class Tuner {
 public:
  // Microseconds for one candidate; a negative or non-finite time rejects it.
  using TimeFn = std::function<double(const TuningChoice&)>;
  // True when the candidate's output matches the reference; else false and
  // the reason in *why.
  using RefcheckFn = std::function<bool(const TuningChoice&, std::string* why)>;
  // One human-readable line per event (a rejection, a time, the winner).
  using ProgressFn = std::function<void(const std::string&)>;

  Tuner(TimeFn time_us, RefcheckFn refcheck, ProgressFn progress = nullptr);

  // Checks each candidate, times those that pass, and returns the fastest
  // with time_us set; a tie goes to the earlier candidate. Throws
  // std::runtime_error, listing each candidate's reason, when none passes.
  TuningChoice tune(const std::vector<TuningChoice>& candidates) const;

 private:
  void report(const std::string& line) const;

  TimeFn time_us_;
  RefcheckFn refcheck_;
  ProgressFn progress_;
};

}  // namespace unimoe
