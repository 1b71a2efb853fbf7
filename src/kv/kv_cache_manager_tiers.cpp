// KvCacheManager's host and store tiers: offload on eviction, write-through to the block
// store, and store prefetch staged in the host tier.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/check.h"
#include "kv/kv_cache_manager.h"

namespace dsinfer::kv {

namespace {
// Bounds the set of store units known to be written; past it the set restarts and a few units
// may be written twice (the store keeps one copy).
constexpr size_t kMaxKnownStoredUnits = 1 << 20;
}  // namespace

void KvCacheManager::offload_to_host(BlockId id) {
  const BlockMeta& m = meta_[id];
  if (host_->contains(m.hash)) return;  // a restored block whose host copy is still there
  auto buffer = std::make_shared<ByteBuffer>(block_bytes_);
  config_.block_io->read_block(id, buffer->data());
  auto block = std::make_shared<HostBlock>();
  block->hash = m.hash;
  block->parent_hash = m.parent_hash;
  block->tokens = m.tokens;
  block->buffer = std::move(buffer);
  block->num_bytes = block_bytes_;
  host_->put(std::move(block));
  ++counters_.num_blocks_offloaded;
}

BlockHash KvCacheManager::store_root(const std::string& cache_salt) const {
  return namespace_hash(store_identity_, cache_salt);
}

void KvCacheManager::write_through(RequestBlocks& req, std::span<const TokenId> tokens,
                                   const std::string& cache_salt, const std::string& traffic_class) {
  const int unit_tokens = config_.store_unit_tokens;
  const int num_units = static_cast<int>(tokens.size()) / unit_tokens;
  if (req.num_store_units_checked == 0) req.store_last_key = store_root(cache_salt);
  for (int u = req.num_store_units_checked; u < num_units; ++u) {
    const auto unit_span = tokens.subspan(static_cast<size_t>(u) * unit_tokens, unit_tokens);
    const BlockHash parent_key = req.store_last_key;
    const BlockHash key = chain_hash(parent_key, unit_span);
    req.store_last_key = key;
    req.num_store_units_checked = u + 1;
    if (known_stored_units_.count(key)) continue;
    StoreObject object;
    object.key = key;
    object.parent_key = parent_key;
    object.model_identity = store_identity_;
    object.traffic_class = traffic_class;
    object.tokens.assign(tokens.begin(), tokens.begin() + static_cast<long>(u + 1) * unit_tokens);
    object.data.resize(block_bytes_ * blocks_per_unit_);
    // The device → host copy happens here; the disk write happens on the store's threads.
    for (int j = 0; j < blocks_per_unit_; ++j)
      config_.block_io->read_block(req.blocks[u * blocks_per_unit_ + j], object.data.data() + j * block_bytes_);
    if (!config_.store->write_async(std::move(object))) continue;  // dropped: the store is behind
    if (known_stored_units_.size() >= kMaxKnownStoredUnits) known_stored_units_.clear();
    known_stored_units_.insert(key);
    ++counters_.num_store_units_queued;
  }
}

int KvCacheManager::prefetch(RequestId id, std::span<const TokenId> tokens, const std::string& cache_salt) {
  if (!config_.store || !config_.enable_prefix_caching || tokens.empty()) return 0;
  poll_store_reads();
  const int bs = config_.block_size_tokens;
  const int unit_tokens = config_.store_unit_tokens;
  // Units entirely before the last token (which is always computed).
  const int num_units = static_cast<int>((tokens.size() - 1) / unit_tokens);
  if (num_units == 0) return 0;
  // Start at the first unit that the device and host tiers do not fully hold.
  const ComputedPrefix cached = get_computed_blocks(tokens, cache_salt);
  const int first_unit = (static_cast<int>(cached.blocks.size() + cached.loads.size())) / blocks_per_unit_;
  const std::vector<BlockHash> block_hashes =
      chain_hashes(cache_salt.empty() ? model_root_ : namespace_hash(config_.model_identity, cache_salt), tokens, bs,
                   num_units * blocks_per_unit_);
  std::vector<BlockHash> keys = chain_hashes(store_root(cache_salt), tokens, unit_tokens, num_units);
  int num_issued = 0;
  std::vector<BlockHash>* request_keys = &prefetch_keys_[id];
  request_keys->clear();
  for (int u = first_unit; u < num_units; ++u) {
    request_keys->push_back(keys[u]);
    if (pending_reads_.count(keys[u])) continue;  // another request already asked for it
    PendingStoreRead pending;
    const int first_block = u * blocks_per_unit_;
    pending.block_hashes.assign(block_hashes.begin() + first_block, block_hashes.begin() + first_block + blocks_per_unit_);
    pending.first_parent_hash =
        first_block == 0 ? (cache_salt.empty() ? model_root_ : namespace_hash(config_.model_identity, cache_salt))
                         : block_hashes[first_block - 1];
    pending.unit_tokens.assign(tokens.begin() + static_cast<long>(u) * unit_tokens,
                               tokens.begin() + static_cast<long>(u + 1) * unit_tokens);
    pending.read = config_.store->read_async(
        keys[u], store_identity_, std::vector<TokenId>(tokens.begin(), tokens.begin() + static_cast<long>(u + 1) * unit_tokens));
    pending_reads_.emplace(keys[u], std::move(pending));
    ++num_issued;
    ++counters_.num_store_reads_issued;
  }
  return num_issued;
}

void KvCacheManager::poll_store_reads() {
  const int bs = config_.block_size_tokens;
  for (auto it = pending_reads_.begin(); it != pending_reads_.end();) {
    PendingStoreRead& p = it->second;
    if (!p.read->ready()) {
      ++it;
      continue;
    }
    if (p.read->hit() && p.read->data().size() == block_bytes_ * blocks_per_unit_) {
      BlockHash parent = p.first_parent_hash;
      for (int j = 0; j < blocks_per_unit_; ++j) {
        auto block = std::make_shared<HostBlock>();
        block->hash = p.block_hashes[j];
        block->parent_hash = parent;
        block->tokens.assign(p.unit_tokens.begin() + j * bs, p.unit_tokens.begin() + (j + 1) * bs);
        block->buffer = p.read->buffer();
        block->offset = p.read->data_offset() + j * block_bytes_;
        block->num_bytes = block_bytes_;
        block->from_store = true;
        parent = block->hash;
        host_->put(std::move(block));
      }
      if (known_stored_units_.size() >= kMaxKnownStoredUnits) known_stored_units_.clear();
      known_stored_units_.insert(it->first);
      ++counters_.num_store_units_staged;
    }
    it = pending_reads_.erase(it);
  }
}

bool KvCacheManager::prefetch_ready(RequestId id) {
  if (pending_reads_.empty()) return true;
  poll_store_reads();
  auto it = prefetch_keys_.find(id);
  if (it == prefetch_keys_.end()) return true;
  return std::none_of(it->second.begin(), it->second.end(),
                      [&](const BlockHash& k) { return pending_reads_.count(k) != 0; });
}

bool KvCacheManager::wait_for_prefetch(RequestId id, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!prefetch_ready(id)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    // Sleep on one read of ours that is still in flight; a short sleep bounds the timeout.
    auto it = prefetch_keys_.find(id);
    for (const BlockHash& k : it->second) {
      auto p = pending_reads_.find(k);
      if (p != pending_reads_.end() && !p->second.read->ready()) {
        p->second.read->wait_for_ms(5);
        break;
      }
    }
  }
  return true;
}

KvCacheMetrics KvCacheManager::metrics() const {
  KvCacheMetrics m = counters_;
  m.num_device_blocks_used = num_used_blocks();
  m.num_device_blocks_total = num_total_blocks();
  m.num_device_blocks_cached = num_cached_;
  if (host_) {
    m.host_bytes_used = host_->used_bytes();
    m.host_capacity_bytes = host_->capacity_bytes();
    m.num_host_blocks = host_->num_blocks();
    m.num_host_evictions = host_->num_evictions();
  }
  if (config_.store) {
    m.has_store = true;
    m.store = config_.store->metrics();
  }
  return m;
}

}  // namespace dsinfer::kv
