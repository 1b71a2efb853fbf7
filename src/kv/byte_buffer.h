// Byte buffers for KV data on its way between disk, host memory and the device.
//
// Two costs dominate moving megabytes through fresh allocations: zero-filling memory that a
// read is about to overwrite, and the page faults of touching new pages. ByteBuffer skips the
// first and backs large buffers with transparent huge pages (one fault per 2 MiB instead of per
// 4 KiB; faults are slow in virtual machines); ByteBufferPool avoids faults altogether by
// recycling buffers once their last owner lets go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace dsinfer::kv {

class ByteBuffer {
 public:
  explicit ByteBuffer(size_t capacity);
  ~ByteBuffer();
  ByteBuffer(const ByteBuffer&) = delete;
  ByteBuffer& operator=(const ByteBuffer&) = delete;
  std::byte* data() { return bytes_.get(); }
  const std::byte* data() const { return bytes_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  void set_size(size_t size) { size_ = size <= capacity_ ? size : capacity_; }
  std::span<const std::byte> span() const { return {bytes_.get(), size_}; }

 private:
  struct Free {
    bool huge = false;
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> bytes_;  // not zeroed
  size_t size_;
  size_t capacity_;
};

// Thread-safe. Buffers handed out return to the pool when released, even after the pool
// object itself is gone (they are then freed).
class ByteBufferPool {
 public:
  explicit ByteBufferPool(int64_t max_pooled_bytes);
  ~ByteBufferPool();
  // A buffer of exactly `size` bytes (its capacity may be larger, at most twice).
  std::shared_ptr<ByteBuffer> acquire(size_t size);
  int64_t pooled_bytes() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace dsinfer::kv
