// Parsing a program's JSON-lines output in tests (lines that are not JSON objects are skipped).
#pragma once

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace dsinfer::testing {

inline std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream ss(text);
  std::string line;
  while (std::getline(ss, line))
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace dsinfer::testing
