#include "kv/host_block_cache.h"

#include <algorithm>

namespace dsinfer::kv {

void HostBlockCache::erase(std::list<std::shared_ptr<HostBlock>>::iterator it) {
  used_bytes_ -= static_cast<int64_t>((*it)->num_bytes);
  index_.erase((*it)->hash);
  lru_.erase(it);
}

void HostBlockCache::put(std::shared_ptr<HostBlock> block) {
  if (auto found = index_.find(block->hash); found != index_.end()) erase(found->second);
  const auto bytes = static_cast<int64_t>(block->num_bytes);
  if (bytes > capacity_bytes_) return;
  while (used_bytes_ + bytes > capacity_bytes_ && !lru_.empty()) {
    erase(std::prev(lru_.end()));
    ++num_evictions_;
  }
  lru_.push_front(std::move(block));
  index_[lru_.front()->hash] = lru_.begin();
  used_bytes_ += bytes;
}

std::shared_ptr<HostBlock> HostBlockCache::get(const BlockHash& hash, const BlockHash& parent_hash,
                                               std::span<const TokenId> tokens) {
  auto found = index_.find(hash);
  if (found == index_.end()) return nullptr;
  const std::shared_ptr<HostBlock>& b = *found->second;
  if (b->parent_hash != parent_hash || !std::equal(tokens.begin(), tokens.end(), b->tokens.begin(), b->tokens.end()))
    return nullptr;
  lru_.splice(lru_.begin(), lru_, found->second);
  return *found->second;
}

}  // namespace dsinfer::kv
