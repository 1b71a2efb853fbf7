// The CUDA backend's private state shared by its source files (not part of its interface).
#pragma once

#include <cstdint>
#include <map>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace dsinfer::cuda {

// The step's token layout: seven int32 fields at fixed offsets of one pinned host buffer and one
// device buffer. The offsets change only when a field outgrows its capacity, and then every
// recording is dropped, since recordings read the fields at the addresses they were made with.
struct CudaBackend::StepBuffers {
  enum Field { kTokenIds, kPositions, kTokenSeq, kSlots, kLogitsRows, kTableOffsets, kTables, kNumFields };
  int64_t capacity[kNumFields] = {};
  int64_t offset[kNumFields] = {};
  int32_t* host = nullptr;  // pinned
  Tensor device;
  cudaEvent_t copied = nullptr;  // the last step's uploads are done reading `host`

  const int32_t* field(Field f) const { return device.as<int32_t>() + offset[f]; }
  ~StepBuffers() {
    if (copied != nullptr) cudaEventDestroy(copied);
    if (host != nullptr) cudaFreeHost(host);
  }
};

struct CudaBackend::Recordings {
  std::map<uint64_t, cudaGraphExec_t> graphs;
  void clear() {
    for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
    graphs.clear();
  }
  ~Recordings() { clear(); }
};


}  // namespace dsinfer::cuda
