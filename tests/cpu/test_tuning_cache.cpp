// The cache key, and the tuning cache's JSON file: save -> load round trips,
// files of another device are kept out with a message naming the field that
// differs, corrupt files are refused naming the file, a missing file is an
// empty cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "support/presets.h"
#include "plan/tuning.h"

namespace unimoe {
namespace {

constexpr DeviceArch kH200Arch{9, 0, 132};  // sm_90, 132 SMs

namespace fs = std::filesystem;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

const TuningDevice kH200{"NVIDIA H200", 132, 13000};

// A fresh directory under the system's temporary one per test, removed after.
class TuningCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = test::fresh_seed();
    dir_ = fs::temp_directory_path() /
           ("unimoe_tuning_" + std::to_string(seed_) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
  }

  // The Error that loading `name` as kH200 throws.
  Error load_error(const std::string& name) const {
    try {
      TuningCache::load(file(name), kH200);
    } catch (const Error& e) {
      return e;
    }
    ADD_FAILURE() << "no Error loading " << name;
    return Error("none", "");
  }

  uint64_t seed_ = 0;
  fs::path dir_;
};

TuningChoice choice(const std::string& text) { return TuningChoice::parse(text); }

TEST(TuningKey, NormalizesTheBackendOnly) {
  MoEConfig c = find_preset("qwen3-30b-a3b").config;
  EXPECT_EQ(kH200.unimoe_version, kVersion);
  const TuningKey automatic = TuningKey::make(kH200, c);
  c.options.backend = "cutlass";
  const TuningKey forced = TuningKey::make(kH200, c);
  EXPECT_EQ(forced.config, automatic.config);
  EXPECT_EQ(MoEConfig::parse(forced.config).options.backend, "auto");
  c.options.deterministic = !c.options.deterministic;
  EXPECT_NE(TuningKey::make(kH200, c).config, automatic.config);
  EXPECT_EQ(kH200.to_string(),
            "NVIDIA H200 (132 SMs, CUDA 13000, unimoe " + std::string(kVersion) + ")");
}

TEST_F(TuningCacheTest, SaveThenLoadGivesEveryEntryBack) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  std::mt19937_64 rng(seed_);
  std::uniform_real_distribution<double> time(0.5, 5000);
  TuningCache cache(kH200);
  std::vector<std::tuple<TuningKey, int, TuningChoice>> put;
  for (const char* preset : {"dsv3-tp8", "mixtral-8x7b", "qwen3-30b-a3b"}) {
    const TuningKey key = TuningKey::make(kH200, find_preset(preset).config);
    for (int bucket : token_buckets(1000)) {
      const std::vector<TuningChoice> cands = candidates_for(find_preset(preset).config, bucket, kH200Arch);
      TuningChoice c = cands[rng() % cands.size()];
      c.time_us = time(rng);
      cache.put(key, bucket, c);
      put.emplace_back(key, bucket, c);
    }
  }
  // put replaces: the last value for a slot wins.
  const TuningKey key0 = std::get<0>(put.front());
  const int bucket0 = std::get<1>(put.front());
  const TuningChoice replacement =
      choice("path=cutlass gemm1=m64n128 gemm2=m64n128 sm90=coop_128x256x64 time_us=9.75");
  cache.put(key0, bucket0, replacement);
  EXPECT_EQ(cache.find(key0, bucket0), replacement);
  std::get<2>(put.front()) = replacement;
  EXPECT_EQ(cache.size(), put.size());

  const std::string path = file("sub/dir/cache.json");  // parents are created
  cache.save(path);
  const TuningCache back = TuningCache::load(path, kH200);
  EXPECT_TRUE(back.messages().empty());
  EXPECT_EQ(back.size(), put.size());
  for (const auto& [key, bucket, c] : put) {
    const std::optional<TuningChoice> found = back.find(key, bucket);
    ASSERT_TRUE(found.has_value()) << key.config << " bucket " << bucket;
    EXPECT_EQ(*found, c);
  }
  EXPECT_FALSE(back.find(key0, 2048).has_value());  // a bucket never put
  EXPECT_FALSE(back.find(TuningKey{kH200, "E=1"}, bucket0).has_value());

  // The file is versioned JSON; nothing else is left in its directory.
  nlohmann::json json;
  std::ifstream(path) >> json;
  EXPECT_EQ(json["format"], 1);
  EXPECT_EQ(json["entries"].size(), put.size());
  EXPECT_EQ(
      std::distance(fs::directory_iterator(fs::path(path).parent_path()), fs::directory_iterator()),
      1);
}

TEST_F(TuningCacheTest, PutRefusesAnotherDeviceAndANonBucket) {
  TuningCache cache(kH200);
  const MoEConfig c = find_preset("dsv3-tp8").config;
  TuningDevice h100 = kH200;
  h100.gpu_name = "NVIDIA H100";
  const TuningChoice x = candidates_for(c, 1, kH200Arch).front();
  EXPECT_THROW(cache.put(TuningKey::make(h100, c), 1, x), Error);
  EXPECT_THROW(cache.put(TuningKey::make(kH200, c), 3, x), Error);
  EXPECT_EQ(cache.size(), 0u);
}

TEST_F(TuningCacheTest, FilesOfAnotherDeviceAreNotUsedAndTheMessageSaysWhy) {
  struct Case {
    const char* differs;
    void (*change)(TuningDevice&);
  };
  const Case cases[] = {
      {"GPU name", [](TuningDevice& d) { d.gpu_name = "NVIDIA H100 80GB HBM3"; }},
      {"SM count", [](TuningDevice& d) { d.sm_count = 114; }},
      {"CUDA version", [](TuningDevice& d) { d.cuda_version = 12080; }},
      {"unimoe version", [](TuningDevice& d) { d.unimoe_version = "0.0.9"; }},
  };
  const MoEConfig c = find_preset("mixtral-8x7b").config;
  const TuningChoice x =
      choice("path=mma gemm1=m16n64 gemm2=m16n64 sm90=coop_128x128x64 time_us=12.5");
  for (const Case& k : cases) {
    SCOPED_TRACE(k.differs);
    TuningDevice other = kH200;
    k.change(other);
    TuningCache theirs(other);
    theirs.put(TuningKey::make(other, c), 1, x);
    theirs.put(TuningKey::make(other, c), 2, x);
    theirs.save(file("theirs.json"));

    const TuningCache ours = TuningCache::load(file("theirs.json"), kH200);
    EXPECT_EQ(ours.size(), 0u);
    EXPECT_FALSE(ours.find(TuningKey::make(kH200, c), 1).has_value());
    ASSERT_EQ(ours.messages().size(), 1u);
    const std::string& m = ours.messages()[0];
    EXPECT_EQ(m, "tuning cache " + file("theirs.json") + ": 2 entries are for " +
                     other.to_string() + "; this is " + kH200.to_string() +
                     ": not used (differs: " + k.differs + ")");
  }
}

TEST_F(TuningCacheTest, OtherDevicesEntriesSurviveASave) {
  const MoEConfig c = find_preset("qwen3-30b-a3b").config;
  TuningDevice h100{"NVIDIA H100", 132, 12080};
  const TuningChoice a =
      choice("path=mma gemm1=m16n64 gemm2=m16n128 sm90=coop_128x128x64 time_us=1.25");
  const TuningChoice b =
      choice("path=cutlass gemm1=m64n128 gemm2=m64n128 sm90=pingpong_64x128x64 time_us=80");
  TuningCache theirs(h100);
  theirs.put(TuningKey::make(h100, c), 16, a);
  theirs.save(file("shared.json"));

  TuningCache ours = TuningCache::load(file("shared.json"), kH200);
  ours.put(TuningKey::make(kH200, c), 16, b);
  ours.save(file("shared.json"));

  const TuningCache h100_view = TuningCache::load(file("shared.json"), h100);
  EXPECT_EQ(h100_view.find(TuningKey::make(h100, c), 16), a);
  const TuningCache h200_view = TuningCache::load(file("shared.json"), kH200);
  EXPECT_EQ(h200_view.find(TuningKey::make(kH200, c), 16), b);
  EXPECT_EQ(h200_view.size(), 1u);
  ASSERT_EQ(h200_view.messages().size(), 1u);
  EXPECT_TRUE(contains(h200_view.messages()[0], "1 entry is for NVIDIA H100"));
  EXPECT_TRUE(contains(h200_view.messages()[0], "differs: GPU name, CUDA version"));
}

TEST_F(TuningCacheTest, AMissingFileIsAnEmptyCache) {
  const TuningCache cache = TuningCache::load(file("never_written.json"), kH200);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_TRUE(cache.messages().empty());
  EXPECT_EQ(cache.device().gpu_name, "NVIDIA H200");
}

TEST_F(TuningCacheTest, CorruptFilesThrowNamingTheFile) {
  const std::string entry =
      R"({"gpu_name": "NVIDIA H200", "sm_count": 132, "cuda_version": 13000, "unimoe_version": ")" +
      std::string(kVersion) + R"(", "config": "E=8", "bucket": BUCKET, "choice": "CHOICE"})";
  auto file_with = [&](const std::string& bucket, const std::string& choice_text) {
    std::string e = entry;
    e.replace(e.find("BUCKET"), 6, bucket);
    e.replace(e.find("CHOICE"), 6, choice_text);
    return R"({"format": 1, "entries": [)" + e + "]}";
  };
  const std::string good = "path=mma gemm1=m16n64 gemm2=m16n64 sm90=coop_128x128x64 time_us=1";
  write("good.json", file_with("4", good));
  EXPECT_EQ(TuningCache::load(file("good.json"), kH200).size(), 1u);  // the template is valid

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"format\": 1, \"entries\": [", "not valid JSON"},
      {"", "not valid JSON"},
      {"[1, 2]", "no integer \"format\""},
      {R"({"format": 2, "entries": []})", "format 2; this build reads format 1"},
      {R"({"format": 1})", "no \"entries\" array"},
      {file_with("3", good), "entry 0: bucket: 3 is not a token bucket"},
      {file_with("\"4\"", good), "entry 0:"},
      {file_with("4", "path=mma"), "entry 0: tuning_choice: missing key 'gemm1'"},
      {R"({"format": 1, "entries": [{"gpu_name": "NVIDIA H200"}]})", "entry 0:"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& [text, expected] = cases[i];
    const std::string name = "corrupt" + std::to_string(i) + ".json";
    write(name, text);
    const Error e = load_error(name);
    SCOPED_TRACE(text + " -> " + e.what());
    EXPECT_EQ(e.field(), "tuning_cache");
    EXPECT_TRUE(contains(e.what(), "tuning cache " + file(name) + ": "));
    EXPECT_TRUE(contains(e.what(), expected));
  }
}

// The committed H200 winners (bench/results) load, and every one is a
// candidate the tuner would offer today.
TEST(CommittedTuningCache, H200WinnersLoadAndAreCurrentCandidates) {
  const std::string path = std::string(UNIMOE_SOURCE_DIR) + "/bench/results/h200/tuning-cache.json";
  const TuningCache cache = TuningCache::load(path, kH200);
  int found = 0;
  for (const char* preset : {"mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "dsv3-tp8", "gpt-oss-120b"})
    for (int bucket : {1, 8, 64, 512, 4096, 16384}) {
      const MoEConfig c = find_preset(preset).config;
      const std::optional<TuningChoice> w = cache.find(TuningKey::make(kH200, c), bucket);
      ASSERT_TRUE(w.has_value()) << preset << " bucket " << bucket;
      ++found;
      bool offered = false;
      for (TuningChoice cand : candidates_for(c, bucket, kH200Arch)) {
        cand.time_us = w->time_us;
        offered |= cand == *w;
      }
      EXPECT_TRUE(offered) << preset << " bucket " << bucket << ": " << w->to_string();
    }
  EXPECT_EQ(found, 30);
}

}  // namespace
}  // namespace unimoe
