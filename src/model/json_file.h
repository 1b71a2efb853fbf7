// Reading the small JSON files of a model directory (config.json, the shard index) with a size
// bound, so that a wrong file is refused instead of slurped.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace dsinfer {

// Throws Error: kNotFound (message "<path>: cannot open<open_hint>") when the file cannot be
// opened; `bad_code` when it is larger than max_bytes ("<path>: larger than N MB, not <what>")
// or not JSON ("<path>: not valid JSON (at byte K)").
nlohmann::json read_json_file(const std::string& path, size_t max_bytes, StatusCode bad_code,
                              const std::string& what, const std::string& open_hint = "");

}  // namespace dsinfer
