// The tuning cache's JSON file (contract: plan/tuning.h; format:
// docs/tuning.md). Each entry carries its whole key, so that one file can
// hold the winners of several devices and configs.
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "plan/tuning.h"

namespace unimoe {
namespace {

// Bumped when the file's layout changes; a file of another format is refused
// rather than guessed at.
constexpr int kCacheFormat = 1;

Error cache_error(const std::string& path, const std::string& what) {
  return Error("tuning_cache", "tuning cache " + path + ": " + what);
}

}  // namespace

TuningCache::TuningCache(TuningDevice device) : device_(std::move(device)) {}

TuningCache::Slot TuningCache::slot(const TuningKey& key, int bucket) {
  const TuningDevice& d = key.device;
  return Slot{d.gpu_name, d.sm_count, d.cuda_version, d.unimoe_version, key.config, bucket};
}

std::optional<TuningChoice> TuningCache::find(const TuningKey& key, int bucket) const {
  const auto it = entries_.find(slot(key, bucket));
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void TuningCache::put(const TuningKey& key, int bucket, const TuningChoice& choice) {
  check_token_bucket(bucket);
  if (!(key.device == device_))
    throw Error("tuning_cache", "key is for " + key.device.to_string() + "; this cache is for " +
                                    device_.to_string());
  entries_[slot(key, bucket)] = choice;
}

TuningCache TuningCache::load(const std::string& path, const TuningDevice& device) {
  TuningCache cache(device);
  std::ifstream in(path);
  if (!in) {
    // No file yet: nothing tuned. A file that exists but cannot be opened
    // (permissions, a directory) is an error.
    if (!std::filesystem::exists(path)) return cache;
    throw cache_error(path, "cannot be read");
  }
  nlohmann::json file;
  try {
    file = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw cache_error(path, std::string("not valid JSON: ") + e.what());
  }
  if (!file.is_object() || !file.contains("format") || !file["format"].is_number_integer())
    throw cache_error(path, "no integer \"format\" field; not a unimoe tuning cache");
  if (file["format"].get<int>() != kCacheFormat)
    throw cache_error(path, "format " + file["format"].dump() + "; this build reads format " +
                                std::to_string(kCacheFormat));
  if (!file.contains("entries") || !file["entries"].is_array())
    throw cache_error(path, "no \"entries\" array");

  // Entries per other device, for one message each.
  std::map<std::string, std::pair<TuningDevice, int>> others;
  const nlohmann::json& entries = file["entries"];
  for (std::size_t i = 0; i < entries.size(); ++i) {
    TuningKey key;
    int bucket = 0;
    TuningChoice choice;
    try {
      const nlohmann::json& e = entries[i];
      key.device.gpu_name = e.at("gpu_name").get<std::string>();
      key.device.sm_count = e.at("sm_count").get<int>();
      key.device.cuda_version = e.at("cuda_version").get<int>();
      key.device.unimoe_version = e.at("unimoe_version").get<std::string>();
      key.config = e.at("config").get<std::string>();
      bucket = e.at("bucket").get<int>();
      check_token_bucket(bucket);
      choice = TuningChoice::parse(e.at("choice").get<std::string>());
    } catch (const std::exception& e) {
      throw cache_error(path, "entry " + std::to_string(i) + ": " + e.what());
    }
    if (key.device == device) {
      cache.entries_[slot(key, bucket)] = choice;
    } else {
      cache.others_[slot(key, bucket)] = choice;
      auto& [other, count] = others[key.device.to_string()];
      other = key.device;
      ++count;
    }
  }
  for (const auto& [name, other_count] : others) {
    const auto& [other, count] = other_count;
    cache.messages_.push_back("tuning cache " + path + ": " + std::to_string(count) +
                              (count == 1 ? " entry is" : " entries are") + " for " + name +
                              "; this is " + device.to_string() +
                              ": not used (differs: " + device.differences(other) + ")");
  }
  return cache;
}

void TuningCache::save(const std::string& path) const {
  // ordered_json keeps the fields in the order written: "format" first.
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  for (const auto* part : {&entries_, &others_})
    for (const auto& [s, choice] : *part) {
      const auto& [gpu_name, sm_count, cuda_version, unimoe_version, config, bucket] = s;
      entries.push_back({{"gpu_name", gpu_name},
                         {"sm_count", sm_count},
                         {"cuda_version", cuda_version},
                         {"unimoe_version", unimoe_version},
                         {"config", config},
                         {"bucket", bucket},
                         {"choice", choice.to_string()}});
    }
  const nlohmann::ordered_json file = {{"format", kCacheFormat}, {"entries", entries}};

  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  // A name of its own per writer, so that two processes saving at once
  // never write into one temporary file.
  const std::string tmp = path + ".tmp" + std::to_string(std::random_device{}());
  {
    std::ofstream out(tmp);
    out << file.dump(2) << "\n";
    if (!out.flush()) throw cache_error(path, "cannot write " + tmp);
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw cache_error(path, "cannot replace the file: " + why);
  }
}

}  // namespace unimoe
