#include "backend/cuda/kernel_launch.cuh"

#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"

namespace dsinfer::cuda {

bool overlapped_launches_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DSINFER_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

int device_multiprocessors() {
  static const int num_sms = [] {
    int device = 0, sms = 0;
    DS_CUDA_CHECK(cudaGetDevice(&device));
    DS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
  }();
  return num_sms;
}

}  // namespace dsinfer::cuda
