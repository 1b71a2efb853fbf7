// How the KV cache manager moves a device block's data to and from host memory. Each backend
// implements it over its cache tensors; the manager never knows their layout, only that one
// device block is block_bytes() opaque bytes covering every layer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsinfer::kv {

using BlockId = int32_t;

class KvBlockIo {
 public:
  virtual ~KvBlockIo() = default;
  virtual size_t block_bytes() const = 0;                          // all layers of one device block
  virtual void read_block(BlockId id, std::byte* dst) = 0;          // device → host, complete on return
  virtual void write_block(BlockId id, const std::byte* src) = 0;   // host → device, visible to the next step
};

}  // namespace dsinfer::kv
