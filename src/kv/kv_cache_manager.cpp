#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <utility>

#include "core/check.h"
#include "core/status.h"

namespace dsinfer::kv {

KvCacheManager::KvCacheManager(KvCacheConfig config) : config_(std::move(config)) {
  if (config_.num_device_blocks < 0 || config_.block_size_tokens <= 0)
    throw Error("kv cache: num_device_blocks must be >= 0 and block_size_tokens > 0");
  model_root_ = namespace_hash(config_.model_identity, "");
  meta_.resize(config_.num_device_blocks);
  // Block ids are handed out in ascending order from a fresh pool, which keeps tests readable.
  for (BlockId id = 0; id < config_.num_device_blocks; ++id) push_free_tail(id);

  const bool want_tiers = config_.host_cache_bytes > 0 || config_.store;
  if (want_tiers && config_.enable_prefix_caching) {
    if (!config_.block_io) throw Error("kv cache: the host tier and the block store need a KvBlockIo");
    block_bytes_ = config_.block_io->block_bytes();
    offload_to_host_ = config_.host_cache_bytes > 0;
    int64_t host_bytes = config_.host_cache_bytes;
    if (config_.store) {
      if (config_.store_unit_tokens <= 0 || config_.store_unit_tokens % config_.block_size_tokens != 0)
        throw Error("kv cache: store_unit_tokens must be a positive multiple of block_size_tokens");
      blocks_per_unit_ = config_.store_unit_tokens / config_.block_size_tokens;
      host_bytes = std::max(host_bytes, config_.store_staging_bytes);
      // Objects are only shared by processes that lay a unit's bytes out the same way.
      store_identity_ = config_.model_identity + ";block_tokens=" + std::to_string(config_.block_size_tokens) +
                        ";block_bytes=" + std::to_string(block_bytes_);
    }
    host_ = std::make_unique<HostBlockCache>(host_bytes);
  }
}

int KvCacheManager::num_free_blocks() const { return num_free_; }
int KvCacheManager::num_used_blocks() const { return config_.num_device_blocks - num_free_; }
int KvCacheManager::num_total_blocks() const { return config_.num_device_blocks; }
int KvCacheManager::block_size_tokens() const { return config_.block_size_tokens; }
int KvCacheManager::num_cached_blocks() const { return num_cached_; }

const std::vector<BlockId>& KvCacheManager::block_table(RequestId id) const {
  static const std::vector<BlockId> kEmpty;
  auto it = requests_.find(id);
  return it == requests_.end() ? kEmpty : it->second.blocks;
}

// ---- free queue (intrusive doubly linked list over meta_) ----

void KvCacheManager::push_free_tail(BlockId id) {
  BlockMeta& m = meta_[id];
  DS_CHECK(!m.in_free_queue && m.ref_count == 0);
  m.prev_free = free_tail_;
  m.next_free = -1;
  if (free_tail_ >= 0) meta_[free_tail_].next_free = id; else free_head_ = id;
  free_tail_ = id;
  m.in_free_queue = true;
  ++num_free_;
}

void KvCacheManager::push_free_head(BlockId id) {
  BlockMeta& m = meta_[id];
  DS_CHECK(!m.in_free_queue && m.ref_count == 0);
  m.prev_free = -1;
  m.next_free = free_head_;
  if (free_head_ >= 0) meta_[free_head_].prev_free = id; else free_tail_ = id;
  free_head_ = id;
  m.in_free_queue = true;
  ++num_free_;
}

void KvCacheManager::unlink_free(BlockId id) {
  BlockMeta& m = meta_[id];
  DS_CHECK(m.in_free_queue);
  if (m.prev_free >= 0) meta_[m.prev_free].next_free = m.next_free; else free_head_ = m.next_free;
  if (m.next_free >= 0) meta_[m.next_free].prev_free = m.prev_free; else free_tail_ = m.prev_free;
  m.prev_free = m.next_free = -1;
  m.in_free_queue = false;
  --num_free_;
}

void KvCacheManager::uncache(BlockId id) {
  BlockMeta& m = meta_[id];
  if (!m.cached) return;
  auto it = index_.find(m.hash);
  DS_CHECK(it != index_.end() && it->second == id);
  index_.erase(it);
  m.cached = false;
  ++m.generation;  // children that name this block as parent no longer match
  m.tokens.clear();
  m.tokens.shrink_to_fit();
  m.cache_salt.clear();
  --num_cached_;
}

BlockId KvCacheManager::pop_free_block() {
  DS_CHECK(free_head_ >= 0);
  BlockId id = free_head_;
  unlink_free(id);
  if (meta_[id].cached && offload_to_host_) offload_to_host(id);
  uncache(id);
  return id;
}

// ---- prefix lookup ----

bool KvCacheManager::is_orphan(BlockId id) const {
  const BlockMeta& m = meta_[id];
  if (m.parent < 0) return false;
  const BlockMeta& p = meta_[m.parent];
  return !p.cached || p.generation != m.parent_generation;
}

bool KvCacheManager::block_matches(BlockId id, std::span<const TokenId> tokens, BlockId parent,
                                   const std::string& cache_salt) const {
  const BlockMeta& m = meta_[id];
  if (!m.cached || m.parent != parent) return false;
  if (parent < 0) {
    if (m.cache_salt != cache_salt) return false;
  } else {
    const BlockMeta& p = meta_[parent];
    if (!p.cached || p.generation != m.parent_generation) return false;
  }
  return std::equal(tokens.begin(), tokens.end(), m.tokens.begin(), m.tokens.end());
}

ComputedPrefix KvCacheManager::get_computed_blocks(std::span<const TokenId> tokens,
                                                   const std::string& cache_salt) {
  ComputedPrefix out;
  out.cache_salt = cache_salt;
  out.stats.num_prompt_tokens = static_cast<int>(tokens.size());
  if (!config_.enable_prefix_caching || tokens.empty()) return out;
  if (!pending_reads_.empty()) poll_store_reads();
  const int bs = config_.block_size_tokens;
  const int max_blocks = static_cast<int>((tokens.size() - 1) / bs);
  BlockHash hash = cache_salt.empty() ? model_root_ : namespace_hash(config_.model_identity, cache_salt);
  BlockId parent = -1;
  int i = 0;
  for (; i < max_blocks; ++i) {
    auto block_tokens = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    const BlockHash next = chain_hash(hash, block_tokens);
    auto it = index_.find(next);
    if (it == index_.end() || !block_matches(it->second, block_tokens, parent, cache_salt)) break;
    hash = next;
    parent = it->second;
    out.blocks.push_back(parent);
    out.generations.push_back(meta_[parent].generation);
  }
  out.stats.num_device_hit_tokens = static_cast<int>(out.blocks.size()) * bs;
  // The host tier continues the chain where the device stopped.
  for (; host_ && i < max_blocks; ++i) {
    auto block_tokens = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    const BlockHash next = chain_hash(hash, block_tokens);
    std::shared_ptr<HostBlock> b = host_->get(next, hash, block_tokens);
    if (!b) break;
    (b->from_store ? out.stats.num_store_hit_tokens : out.stats.num_host_hit_tokens) += bs;
    out.loads.push_back(std::move(b));
    hash = next;
  }
  out.num_tokens = static_cast<int>(out.blocks.size() + out.loads.size()) * bs;
  return out;
}

// ---- allocation ----

bool KvCacheManager::allocate_slots(RequestId id, int num_total_tokens, const ComputedPrefix& prefix) {
  DS_CHECK(num_total_tokens >= 0);
  const int bs = config_.block_size_tokens;
  auto it = requests_.find(id);
  const bool is_new = it == requests_.end();
  const bool first_call = is_new || it->second.blocks.empty();
  const bool use_prefix = first_call && (!prefix.blocks.empty() || !prefix.loads.empty());
  const int num_existing = is_new ? 0 : static_cast<int>(it->second.blocks.size());

  int num_prefix_in_queue = 0;  // prefix blocks that are free now: taking them uses pool space
  if (use_prefix) {
    DS_CHECK(prefix.generations.size() == prefix.blocks.size());
    DS_CHECK(prefix.loads.empty() || config_.block_io != nullptr);
    for (size_t i = 0; i < prefix.blocks.size(); ++i) {
      BlockId b = prefix.blocks[i];
      DS_CHECK(b >= 0 && b < config_.num_device_blocks);
      const BlockMeta& m = meta_[b];
      if (!m.cached || m.generation != prefix.generations[i]) return false;  // stale lookup
      if (m.ref_count == 0) ++num_prefix_in_queue;
    }
  }
  const int num_shared = use_prefix ? static_cast<int>(prefix.blocks.size()) : 0;
  const int num_loads = use_prefix ? static_cast<int>(prefix.loads.size()) : 0;
  const int num_needed = std::max((num_total_tokens + bs - 1) / bs, num_existing + num_shared + num_loads);
  const int num_new = std::max(0, num_needed - num_existing - num_shared);
  if (num_new > num_free_ - num_prefix_in_queue) return false;

  RequestBlocks& req = is_new ? requests_[id] : it->second;
  if (first_call) {
    counters_.num_prompt_tokens += prefix.stats.num_prompt_tokens;
    counters_.num_device_hit_tokens += use_prefix ? prefix.stats.num_device_hit_tokens : 0;
    counters_.num_host_hit_tokens += use_prefix ? prefix.stats.num_host_hit_tokens : 0;
    counters_.num_store_hit_tokens += use_prefix ? prefix.stats.num_store_hit_tokens : 0;
  }
  if (use_prefix && num_shared > 0) {
    for (BlockId b : prefix.blocks) {
      BlockMeta& m = meta_[b];
      if (m.ref_count == 0) unlink_free(b);
      ++m.ref_count;
      req.blocks.push_back(b);
    }
    // The prefix blocks are already in the index: registration resumes after them.
    const BlockMeta& last = meta_[prefix.blocks.back()];
    req.num_hashed_blocks = num_shared;
    req.last_hash = last.hash;
    req.last_canonical = prefix.blocks.back();
    req.last_canonical_generation = last.generation;
  }
  for (int i = 0; i < num_new; ++i) {
    BlockId b = pop_free_block();
    meta_[b].ref_count = 1;
    req.blocks.push_back(b);
  }
  if (num_loads > 0) {
    if (num_shared == 0) req.last_hash = prefix.loads.front()->parent_hash;  // the namespace root
    for (int j = 0; j < num_loads; ++j) {
      HostBlock& load = *prefix.loads[j];
      const int i = num_shared + j;
      const BlockId own = req.blocks[i];
      config_.block_io->write_block(own, load.data().data());
      load.from_store = false;  // from now on a hit on this copy is a host hit
      ++counters_.num_blocks_restored;
      req.num_hashed_blocks = i + 1;
      req.last_hash = load.hash;
      if (req.chain_broken) continue;
      const BlockId canonical =
          register_block(req, i, own, load.parent_hash, load.hash, load.tokens, prefix.cache_salt);
      if (canonical < 0) {
        req.chain_broken = true;
        continue;
      }
      req.last_canonical = canonical;
      req.last_canonical_generation = meta_[canonical].generation;
    }
  }
  return true;
}

// ---- registration ----

BlockId KvCacheManager::register_block(RequestBlocks& req, int i, BlockId own, const BlockHash& parent_hash,
                                       const BlockHash& hash, std::span<const TokenId> block_tokens,
                                       const std::string& cache_salt) {
  const BlockId parent = i == 0 ? -1 : req.last_canonical;
  if (parent >= 0 && (!meta_[parent].cached || meta_[parent].generation != req.last_canonical_generation)) {
    // The block our prefix was registered under has been evicted; children would be
    // unreachable through it.
    return -1;
  }
  auto found = index_.find(hash);
  if (found != index_.end()) {
    // Another request registered this prefix first (or it is our own prefix block): reuse
    // its entry if it really holds the same tokens after the same parent.
    if (found->second == own || block_matches(found->second, block_tokens, parent, cache_salt))
      return found->second;
    if (!is_orphan(found->second)) return -1;  // a true 128-bit collision
    // Its parent was evicted, so no lookup can reach it: give the slot to our block.
    uncache(found->second);
  }
  if (meta_[own].cached) return -1;  // already stands for another prefix
  BlockMeta& m = meta_[own];
  m.cached = true;
  m.hash = hash;
  m.parent_hash = parent_hash;
  m.parent = parent;
  m.parent_generation = parent >= 0 ? meta_[parent].generation : 0;
  m.cache_salt = parent < 0 ? cache_salt : std::string();
  m.tokens.assign(block_tokens.begin(), block_tokens.end());
  index_.emplace(hash, own);
  ++num_cached_;
  return own;
}

void KvCacheManager::cache_full_blocks(RequestId id, std::span<const TokenId> tokens, int num_computed_tokens,
                                       const std::string& cache_salt, const std::string& traffic_class) {
  if (!config_.enable_prefix_caching) return;
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  RequestBlocks& req = it->second;
  const int bs = config_.block_size_tokens;
  const int num_computed = std::min<int>(num_computed_tokens, static_cast<int>(tokens.size()));
  const int num_full = std::min<int>(num_computed / bs, static_cast<int>(req.blocks.size()));
  if (req.num_hashed_blocks == 0)
    req.last_hash = cache_salt.empty() ? model_root_ : namespace_hash(config_.model_identity, cache_salt);
  for (int i = req.num_hashed_blocks; i < num_full; ++i) {
    auto block_tokens = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    const BlockHash parent_hash = req.last_hash;
    req.last_hash = chain_hash(parent_hash, block_tokens);
    req.num_hashed_blocks = i + 1;
    if (req.chain_broken) continue;
    const BlockId canonical = register_block(req, i, req.blocks[i], parent_hash, req.last_hash, block_tokens, cache_salt);
    if (canonical < 0) {
      req.chain_broken = true;
      continue;
    }
    req.last_canonical = canonical;
    req.last_canonical_generation = meta_[canonical].generation;
  }
  if (config_.store) write_through(req, tokens.first(static_cast<size_t>(num_full) * bs), cache_salt, traffic_class);
}

void KvCacheManager::free(RequestId id) {
  prefetch_keys_.erase(id);
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  // Tail blocks first: a sequence's later blocks are the least likely to be shared, so they
  // should be evicted before its earlier ones.
  const std::vector<BlockId>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    BlockMeta& m = meta_[*b];
    DS_CHECK(m.ref_count > 0);
    if (--m.ref_count == 0) {
      if (m.cached) push_free_tail(*b); else push_free_head(*b);
    }
  }
  requests_.erase(it);
}

}  // namespace dsinfer::kv
