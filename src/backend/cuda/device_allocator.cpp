#include "backend/cuda/device_allocator.h"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/status.h"

namespace dsinfer::cuda {
namespace {

constexpr size_t kSmallBytes = size_t{1} << 20;

// Small blocks round to 512 bytes, large ones to 2 MiB, so that the activations of steps with
// slightly different token counts share blocks.
size_t round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes < kSmallBytes) return (bytes + 511) / 512 * 512;
  return (bytes + (size_t{2} << 20) - 1) / (size_t{2} << 20) * (size_t{2} << 20);
}

}  // namespace

DeviceAllocator::~DeviceAllocator() {
  hold_reuse(false);
  release_cached();
  for (void* p : graph_blocks_) cudaFree(p);
}

void DeviceAllocator::set_graph_pool(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  current_pool_ = on ? kGraphPool : kEagerPool;
}

void* DeviceAllocator::device_malloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error state before retrying
    release_cached();
    err = cudaMalloc(&p, bytes);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(StatusCode::kResourceExhausted,
                "cuda: cannot allocate " + std::to_string(bytes) + " bytes: " + cudaGetErrorString(err));
  }
  return p;
}

Tensor DeviceAllocator::cached(const std::vector<int64_t>& shape, DType dtype) {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  const size_t bytes = round_size(t.num_bytes());
  void* p = nullptr;
  size_t block_bytes = bytes;
  int pool = kEagerPool;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool = current_pool_;
    auto& idle = idle_[pool];
    auto it = idle.lower_bound(bytes);
    // Take a block of at most 1.25x the request so large idle blocks are not pinned by small users.
    if (it != idle.end() && it->first <= bytes + bytes / 4) {
      p = it->second;
      block_bytes = it->first;
      if (pool == kEagerPool) idle_bytes_ -= it->first;
      idle.erase(it);
    }
  }
  if (p == nullptr) {
    p = device_malloc(bytes);
    if (pool == kGraphPool) {
      std::lock_guard<std::mutex> lock(mu_);
      graph_blocks_.push_back(p);
    }
  }
  auto self = shared_from_this();
  t.storage =
      std::shared_ptr<void>(p, [self, pool, block_bytes](void* q) { self->give_back(pool, q, block_bytes); });
  t.data = p;
  return t;
}

Tensor DeviceAllocator::persistent(const std::vector<int64_t>& shape, DType dtype) {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  void* p = device_malloc(std::max<size_t>(t.num_bytes(), 256));
  t.storage = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  t.data = p;
  return t;
}

Tensor DeviceAllocator::persistent_bytes(size_t num_bytes) {
  return persistent({static_cast<int64_t>(num_bytes)}, DType::kU8);
}

void DeviceAllocator::give_back(int pool, void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (holding_) held_.push_back({pool, p, bytes});
  else cache_block(pool, p, bytes);
}

void DeviceAllocator::cache_block(int pool, void* p, size_t bytes) {
  idle_[pool].emplace(bytes, p);
  if (pool == kEagerPool) idle_bytes_ += bytes;
}

void DeviceAllocator::hold_reuse(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  holding_ = on;
  if (on) return;
  for (const HeldBlock& b : held_) cache_block(b.pool, b.p, b.bytes);
  held_.clear();
}

size_t DeviceAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_bytes_;
}

void DeviceAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [bytes, p] : idle_[kEagerPool]) cudaFree(p);
  idle_[kEagerPool].clear();
  idle_bytes_ = 0;
}

}  // namespace dsinfer::cuda
