// Helpers for engine tests over the committed golden fixtures.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsinfer/engine_types.h"
#include "engine/engine_config.h"

namespace dsinfer::testing {

inline std::string fixture_dir(const std::string& name) {
  return std::string(DSINFER_SOURCE_DIR) + "/tests/data/" + name;
}

inline nlohmann::json fixture_reference(const std::string& name) {
  std::ifstream f(fixture_dir(name) + "/reference.json");
  return nlohmann::json::parse(f);
}

inline EngineConfig fixture_engine_config(const std::string& name) {
  EngineConfig c;
  c.model_dir = fixture_dir(name);
  c.kv_cache_bytes = 64 << 20;
  c.print_load_progress = false;
  return c;
}

// Number of leading tokens of `ours` that agree with the reference path, where a disagreement
// is tolerated (and ends the comparison) only at a step whose reference margin is <= 1e-3.
// Returns -1 if a confident reference token differs.
inline int agreeing_prefix(const std::vector<TokenId>& ours, const std::vector<TokenId>& ref,
                           const std::vector<double>& margins) {
  for (size_t i = 0; i < ref.size() && i < ours.size(); ++i) {
    if (ours[i] != ref[i]) return margins[i] > 1e-3 ? -1 : static_cast<int>(i);
  }
  return static_cast<int>(std::min(ours.size(), ref.size()));
}

}  // namespace dsinfer::testing
