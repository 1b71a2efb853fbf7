// The source tree the tests read tests/data from.
#pragma once

#include <cstdlib>
#include <string>

namespace dsinfer::test_support {

// DSINFER_SOURCE_DIR from the environment where set (a test binary run from another checkout
// than the one it was built in, as on the GPU machine), else the build's.
inline std::string source_dir() {
  const char* env = std::getenv("DSINFER_SOURCE_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(DSINFER_SOURCE_DIR);
}

}  // namespace dsinfer::test_support
