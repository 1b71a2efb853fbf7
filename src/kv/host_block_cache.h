// The host tier: device blocks kept in host memory after the device pool evicted them, and
// blocks staged by block-store reads, bounded in bytes with least-recently-used eviction.
//
// Entries are keyed by the device block's chain hash; a lookup also compares the parent hash
// and the block's own tokens. Entries are shared_ptr so a load in progress keeps its bytes even
// if the entry is evicted meanwhile. Not thread-safe: the engine thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"
#include "kv/byte_buffer.h"

namespace dsinfer::kv {

struct HostBlock {
  BlockHash hash;
  BlockHash parent_hash;
  std::vector<TokenId> tokens;  // this block's tokens
  // The bytes live in a shared buffer so one store object (several blocks) is never copied.
  std::shared_ptr<const ByteBuffer> buffer;
  size_t offset = 0;
  size_t num_bytes = 0;
  bool from_store = false;  // staged by a store read and not yet restored: a hit is a store hit

  std::span<const std::byte> data() const { return buffer->span().subspan(offset, num_bytes); }
};

class HostBlockCache {
 public:
  explicit HostBlockCache(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  // Inserts `block` (replacing an entry of the same hash) as most recently used, evicting the
  // least recently used entries to make room. A block larger than the capacity is not kept.
  void put(std::shared_ptr<HostBlock> block);
  // The entry for `hash` if its parent hash and tokens match; marks it most recently used.
  std::shared_ptr<HostBlock> get(const BlockHash& hash, const BlockHash& parent_hash,
                                 std::span<const TokenId> tokens);
  bool contains(const BlockHash& hash) const { return index_.count(hash) != 0; }

  int64_t used_bytes() const { return used_bytes_; }
  int64_t capacity_bytes() const { return capacity_bytes_; }
  int64_t num_blocks() const { return static_cast<int64_t>(lru_.size()); }
  int64_t num_evictions() const { return num_evictions_; }

 private:
  void erase(std::list<std::shared_ptr<HostBlock>>::iterator it);

  int64_t capacity_bytes_;
  int64_t used_bytes_ = 0;
  int64_t num_evictions_ = 0;
  std::list<std::shared_ptr<HostBlock>> lru_;  // front: most recently used
  std::unordered_map<BlockHash, std::list<std::shared_ptr<HostBlock>>::iterator, BlockHashHasher> index_;
};

}  // namespace dsinfer::kv
