// Device memory for the CUDA backend: a caching allocator for per-step activations and plain
// cudaMalloc for long-lived weights. Never managed memory.
//
// The backend issues its work on one stream, so a block handed back while kernels that use it
// are still queued can be handed out again at once: the next user's kernels run after them.
// Where work forks onto a second stream for a while, blocks handed back meanwhile are held until
// the streams join (hold_reuse).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/tensor.h"

namespace dsinfer::cuda {

class DeviceAllocator : public std::enable_shared_from_this<DeviceAllocator> {
 public:
  ~DeviceAllocator();

  // A device tensor whose storage returns to this allocator's cache when the last reference
  // goes. Throws dsinfer::Error (kResourceExhausted) when the device is out of memory.
  Tensor cached(const std::vector<int64_t>& shape, DType dtype);
  // A device tensor with its own cudaMalloc, freed with cudaFree: for weights and caches, which
  // live long and would only fragment the cache.
  Tensor persistent(const std::vector<int64_t>& shape, DType dtype);
  // Same, sized in bytes (for packed layouts such as an FP8 weight followed by its scales).
  Tensor persistent_bytes(size_t num_bytes);

  size_t cached_bytes() const;
  void release_cached();  // cudaFree every idle cached block of the eager pool

  // While a CUDA graph is being captured, cached() serves from a pool of its own: recorded
  // kernels keep the addresses they were captured with, so those blocks must never be freed
  // or handed to eager work. Captures run one at a time and replays are stream-ordered, so
  // the graph pool's blocks may be shared between graphs.
  void set_graph_pool(bool on);

  // While work runs on two streams, a block handed back by one may still be in use by the
  // other's queued kernels: between hold_reuse(true) and hold_reuse(false) blocks handed back
  // stay out of the cache, and they return to it when the hold ends (after the streams join).
  void hold_reuse(bool on);

 private:
  static constexpr int kEagerPool = 0;
  static constexpr int kGraphPool = 1;
  void* device_malloc(size_t bytes);
  void give_back(int pool, void* p, size_t bytes);
  void cache_block(int pool, void* p, size_t bytes);  // into the pool's idle blocks; mu_ held

  mutable std::mutex mu_;
  int current_pool_ = kEagerPool;
  std::multimap<size_t, void*> idle_[2];  // per pool: rounded size → block
  size_t idle_bytes_ = 0;                 // eager pool
  std::vector<void*> graph_blocks_;       // every block ever given to the graph pool
  struct HeldBlock {
    int pool;
    void* p;
    size_t bytes;
  };
  bool holding_ = false;
  std::vector<HeldBlock> held_;  // handed back while holding_
};

}  // namespace dsinfer::cuda
