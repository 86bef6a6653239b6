// unimoe-bench: writing a result document.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

namespace unimoe::bench {

// Writes `doc` (indented by 1) to `path`, creating its folder first.
inline void write_json_file(const nlohmann::json& doc, const std::string& path) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << doc.dump(1) << "\n";
}

}  // namespace unimoe::bench
