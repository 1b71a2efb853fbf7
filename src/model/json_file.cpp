#include "model/json_file.h"

#include <fstream>
#include <sstream>

namespace dsinfer {

nlohmann::json read_json_file(const std::string& path, size_t max_bytes, StatusCode bad_code,
                              const std::string& what, const std::string& open_hint) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(StatusCode::kNotFound, path + ": cannot open" + open_hint);
  if (static_cast<size_t>(in.tellg()) > max_bytes)
    throw Error(bad_code, path + ": larger than " + std::to_string(max_bytes >> 20) + " MB, not " + what);
  in.seekg(0);
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return nlohmann::json::parse(buffer.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(bad_code, path + ": not valid JSON (at byte " + std::to_string(e.byte) + ")");
  }
}

}  // namespace dsinfer
