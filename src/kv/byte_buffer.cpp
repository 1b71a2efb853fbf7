#include "kv/byte_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

namespace dsinfer::kv {
namespace {
constexpr size_t kHugePageBytes = 2 << 20;
constexpr size_t kHugeThresholdBytes = 1 << 20;
}  // namespace

void ByteBuffer::Free::operator()(std::byte* p) const {
  if (huge) std::free(p);
  else delete[] p;
}

ByteBuffer::ByteBuffer(size_t capacity) : bytes_(nullptr, Free{false}), size_(capacity), capacity_(capacity) {
  if (capacity >= kHugeThresholdBytes) {
    const size_t len = (capacity + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    void* p = std::aligned_alloc(kHugePageBytes, len);
    if (!p) throw std::bad_alloc();
    ::madvise(p, len, MADV_HUGEPAGE);  // a hint: without THP the buffer still works
    bytes_ = std::unique_ptr<std::byte, Free>(static_cast<std::byte*>(p), Free{true});
  } else {
    bytes_ = std::unique_ptr<std::byte, Free>(new std::byte[capacity > 0 ? capacity : 1], Free{false});
  }
}

ByteBuffer::~ByteBuffer() = default;

struct ByteBufferPool::State {
  std::mutex mu;
  int64_t max_pooled_bytes = 0;
  int64_t pooled_bytes = 0;
  std::vector<ByteBuffer*> free;  // owned
  ~State() {
    for (ByteBuffer* b : free) delete b;
  }
};

ByteBufferPool::ByteBufferPool(int64_t max_pooled_bytes) : state_(std::make_shared<State>()) {
  state_->max_pooled_bytes = max_pooled_bytes;
}

ByteBufferPool::~ByteBufferPool() = default;

int64_t ByteBufferPool::pooled_bytes() const {
  std::lock_guard lock(state_->mu);
  return state_->pooled_bytes;
}

std::shared_ptr<ByteBuffer> ByteBufferPool::acquire(size_t size) {
  ByteBuffer* buffer = nullptr;
  {
    std::lock_guard lock(state_->mu);
    auto& free = state_->free;
    for (size_t i = 0; i < free.size(); ++i) {
      // Reuse a buffer big enough but not wastefully so.
      if (free[i]->capacity() >= size && free[i]->capacity() <= 2 * size) {
        buffer = free[i];
        free[i] = free.back();
        free.pop_back();
        state_->pooled_bytes -= static_cast<int64_t>(buffer->capacity());
        break;
      }
    }
  }
  if (!buffer) buffer = new ByteBuffer(size);
  buffer->set_size(size);
  std::weak_ptr<State> weak = state_;
  return std::shared_ptr<ByteBuffer>(buffer, [weak](ByteBuffer* b) {
    if (auto state = weak.lock()) {
      std::lock_guard lock(state->mu);
      const auto bytes = static_cast<int64_t>(b->capacity());
      if (state->pooled_bytes + bytes <= state->max_pooled_bytes) {
        state->free.push_back(b);
        state->pooled_bytes += bytes;
        return;
      }
    }
    delete b;
  });
}

}  // namespace dsinfer::kv
