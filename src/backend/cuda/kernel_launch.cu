#include "backend/cuda/kernel_launch.cuh"

#include <cstdlib>
#include <cstring>

namespace dsinfer::cuda {

bool overlapped_launches_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DSINFER_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

}  // namespace dsinfer::cuda
