// The CUDA backend's private state shared by its source files (not part of its interface).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_timeline.h"

namespace dsinfer::cuda {

// The block-scaled FP8 product's tile width along k, and its row granularity.
constexpr int64_t kLibraryFp8TileColumns = 128;
constexpr int64_t kLibraryFp8RowMultiple = 4;

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

// Asynchronous token choices: two slots used in turn, each a device ids buffer, a pinned host
// copy and the event that marks the copy done. `latest` is the slot of the latest choice,
// which the next begin_step resolves token placeholders from.
struct CudaBackend::Choices {
  struct Slot {
    Tensor ids;               // device, capacity rows
    int32_t* host = nullptr;  // pinned, capacity rows
    int64_t capacity = 0;
    int64_t rows = 0;
    uint64_t ticket = 0;      // 0: free
    cudaEvent_t copied = nullptr;
  };
  Slot slots[2];
  int latest = -1;
  uint64_t next_ticket = 1;
  ~Choices() {
    for (Slot& s : slots) {
      if (s.copied != nullptr) cudaEventDestroy(s.copied);
      if (s.host != nullptr) cudaFreeHost(s.host);
    }
  }
};

struct CudaBackend::Recordings {
  std::map<uint64_t, cudaGraphExec_t> graphs;
  std::map<uint64_t, std::vector<KernelLaunch>> launches;  // with a kernel timeline only
  void clear() {
    for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
    graphs.clear();
    launches.clear();
  }
  ~Recordings() { clear(); }
};


}  // namespace dsinfer::cuda
