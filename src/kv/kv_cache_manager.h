// The device-level KV cache manager: a pool of fixed-size device blocks shared by requests,
// with prefix caching over chain hashes.
//
// Contract (the scheduler's view):
// - Blocks hold `block_size_tokens` tokens of every layer's latent KV. A request owns an
//   ordered block table; token t lives in block_table[t / block_size_tokens].
// - Prefix caching: full blocks a request has computed can be registered (cache_full_blocks)
//   under a chain hash of (model identity, cache salt, all tokens up to the block's end). A
//   later request with the same prefix reuses them (get_computed_blocks + allocate_slots).
//   A hit is confirmed against the stored token ids and the exact parent block, so a hash
//   collision never makes a request read another prefix's KV.
// - Reference counts: a block shared by several requests returns to the pool only when the
//   last one frees it. Free blocks form one queue that doubles as the LRU of cached blocks:
//   blocks without a hash are reused first, then cached blocks, least recently freed first.
// - Running out of blocks is a normal answer (allocate_slots returns false), never an error.
// - Tiers (optional, they need a KvBlockIo from the backend):
//   * host: blocks the device pool evicts are copied to a bounded host LRU and restored on a hit;
//   * store: each complete store unit (store_unit_tokens, several device blocks) a request
//     computes is written through to the KvBlockStore off the engine thread; prefetch() issues
//     a request's store reads before its prefill is scheduled, their results land in the host
//     tier, and get_computed_blocks finds them there.
//   get_computed_blocks looks in device → host (including staged store reads) and returns the
//   blocks to copy into new device blocks in `loads`; allocate_slots does the copies, so the
//   scheduler's calls are the same with or without tiers: prefix.num_tokens tokens are
//   computed as soon as allocate_slots returns true.
// - How exact a hit is, per tier: device blocks are matched on their tokens and their exact
//   parent block; store objects on the whole prefix's tokens; host-tier blocks on their own
//   tokens and their parent's 128-bit hash (a wrong host hit needs an XXH3-128 collision).
// - Cost on the engine thread: offload and write-through copy device → host here (a memcpy
//   on the CPU backend); the disk I/O runs on the store's threads.
// - Metrics count prompt tokens per admission (a request re-admitted after preemption counts
//   again).
// - Not thread-safe: one engine thread drives it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dsinfer/engine_types.h"
#include "kv/block_hash.h"
#include "kv/host_block_cache.h"
#include "kv/kv_block_io.h"
#include "kv/kv_block_store.h"

namespace dsinfer::kv {

struct KvCacheConfig {
  int num_device_blocks = 0;
  int block_size_tokens = 64;          // device block (the attention kernels' page size)
  bool enable_prefix_caching = true;
  std::string model_identity;          // namespace of the hash chain (model name + layout)

  // Tiers. Both need block_io (not owned; must outlive the manager).
  KvBlockIo* block_io = nullptr;
  int64_t host_cache_bytes = 0;        // 0: evicted device blocks are dropped
  std::shared_ptr<KvBlockStore> store; // null: no block store
  int store_unit_tokens = 128;         // a multiple of block_size_tokens
  // Store reads are staged in host memory; without a host tier they get this much of it.
  int64_t store_staging_bytes = 256LL << 20;
};

// A cached prefix found by get_computed_blocks. Its first blocks.size() blocks are on the
// device; the next loads.size() come from the host tier (some staged from the store) and are
// copied into newly allocated device blocks by allocate_slots. num_tokens covers both.
struct ComputedPrefix {
  std::vector<BlockId> blocks;
  int num_tokens = 0;
  // The blocks' generations at lookup time; allocate_slots uses them to notice a block that
  // was evicted and reused in between. Filled by get_computed_blocks.
  std::vector<uint32_t> generations;
  std::vector<std::shared_ptr<HostBlock>> loads;
  std::string cache_salt;  // the lookup's salt, for indexing the loaded blocks
  PromptCacheStats stats;  // prompt tokens served by each tier for this lookup
};

// Counters for /metrics. Token counts cover requests admitted by allocate_slots with a lookup.
struct KvCacheMetrics {
  int64_t num_prompt_tokens = 0;
  int64_t num_device_hit_tokens = 0;
  int64_t num_host_hit_tokens = 0;
  int64_t num_store_hit_tokens = 0;
  int64_t num_computed_tokens() const {
    return num_prompt_tokens - num_device_hit_tokens - num_host_hit_tokens - num_store_hit_tokens;
  }
  int num_device_blocks_used = 0;
  int num_device_blocks_total = 0;
  int num_device_blocks_cached = 0;
  int64_t num_blocks_offloaded = 0;  // device → host on eviction
  int64_t num_blocks_restored = 0;   // host → device on a hit
  int64_t host_bytes_used = 0;
  int64_t host_capacity_bytes = 0;
  int64_t num_host_blocks = 0;
  int64_t num_host_evictions = 0;
  int64_t num_store_units_queued = 0;   // write-through objects handed to the store
  int64_t num_store_reads_issued = 0;
  int64_t num_store_units_staged = 0;   // store reads that hit and were staged in host memory
  bool has_store = false;
  KvStoreMetrics store;
};

class KvCacheManager {
 public:
  explicit KvCacheManager(KvCacheConfig config);
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  // Longest cached prefix of `tokens` in full blocks, never the whole sequence (at least one
  // token must be computed to produce logits). Does not take references yet.
  ComputedPrefix get_computed_blocks(std::span<const TokenId> tokens, const std::string& cache_salt);

  // Gives request `id` blocks covering `num_total_tokens` (its existing blocks + `prefix`
  // blocks on first call + new ones). All or nothing: returns false and changes nothing if
  // the pool cannot provide them (evicting free cached blocks in LRU order first). Also
  // returns false if a prefix block was evicted since get_computed_blocks (look up again).
  bool allocate_slots(RequestId id, int num_total_tokens, const ComputedPrefix& prefix = {});

  // The request's blocks in token order; empty for an unknown request.
  const std::vector<BlockId>& block_table(RequestId id) const;

  // Registers the request's full blocks covered by `num_computed_tokens` of `tokens` in the
  // prefix index (chain hash). Idempotent; `tokens` must start with the same tokens each call.
  // With a store, complete store units are also queued for writing under `traffic_class`
  // (empty: the store's default class).
  void cache_full_blocks(RequestId id, std::span<const TokenId> tokens, int num_computed_tokens,
                         const std::string& cache_salt, const std::string& traffic_class = {});

  // Issues store reads for the store units of `tokens` that the device and host tiers do not
  // hold (never the unit holding the last token). Results are staged in the host tier as they
  // complete. Returns the number of reads issued; 0 without a store.
  int prefetch(RequestId id, std::span<const TokenId> tokens, const std::string& cache_salt);
  // True when none of `id`'s prefetch reads is still in flight (also when none was issued).
  bool prefetch_ready(RequestId id);
  // Blocks until prefetch_ready(id) or `timeout_ms` passed; returns prefetch_ready(id). For an
  // engine with nothing else to do.
  bool wait_for_prefetch(RequestId id, int timeout_ms);
  // Stages every finished store read in the host tier. get_computed_blocks and prefetch_ready
  // call it; an engine loop may call it once per step as well.
  void poll_store_reads();

  KvCacheMetrics metrics() const;

  // Blocks return to the pool; cached ones enter the LRU tail. Also forgets id's prefetch
  // (its reads still complete and stage their blocks for others).
  void free(RequestId id);

  int num_free_blocks() const;   // free + evictable
  int num_used_blocks() const;
  int num_total_blocks() const;
  int block_size_tokens() const;
  int num_cached_blocks() const;  // blocks currently in the prefix index (used or free)
  const HostBlockCache* host_cache() const { return host_.get(); }

 private:
  struct BlockMeta {
    int ref_count = 0;
    bool cached = false;       // in the prefix index under `hash`
    uint32_t generation = 0;   // bumped each time the block leaves the prefix index
    BlockHash hash;
    BlockHash parent_hash;     // the chain link before this block (namespace hash for block 0)
    BlockId parent = -1;       // the cached block this one's KV was computed after; -1: first
    uint32_t parent_generation = 0;
    std::string cache_salt;    // first blocks only: confirms the namespace exactly
    std::vector<TokenId> tokens;  // this block's tokens while cached
    BlockId prev_free = -1;
    BlockId next_free = -1;
    bool in_free_queue = false;
  };
  struct RequestBlocks {
    std::vector<BlockId> blocks;
    int num_hashed_blocks = 0;   // blocks [0, n) have been through cache_full_blocks
    BlockHash last_hash;         // chain hash after num_hashed_blocks blocks
    BlockId last_canonical = -1; // indexed block holding the same prefix as block n-1
    uint32_t last_canonical_generation = 0;
    bool chain_broken = false;   // a collision stopped registration for this request
    int num_store_units_checked = 0;  // units [0, n) were written or known to be stored
    BlockHash store_last_key;         // store chain key after num_store_units_checked units
  };
  // A store read in flight: where its bytes go once it completes.
  struct PendingStoreRead {
    std::shared_ptr<StoreRead> read;
    std::vector<BlockHash> block_hashes;  // the unit's device blocks
    BlockHash first_parent_hash;          // device chain hash before the unit
    std::vector<TokenId> unit_tokens;
  };

  bool block_matches(BlockId id, std::span<const TokenId> tokens, BlockId parent,
                     const std::string& cache_salt) const;
  // Indexes device block `own` as block `i` of a request (hash `hash` after `parent_hash`).
  // Returns the block that now stands for that prefix in the index (`own` or an equal
  // duplicate), or -1 if the chain cannot continue through it.
  BlockId register_block(RequestBlocks& req, int i, BlockId own, const BlockHash& parent_hash,
                         const BlockHash& hash, std::span<const TokenId> block_tokens,
                         const std::string& cache_salt);
  void offload_to_host(BlockId id);
  void write_through(RequestBlocks& req, std::span<const TokenId> tokens, const std::string& cache_salt,
                     const std::string& traffic_class);
  BlockHash store_root(const std::string& cache_salt) const;
  bool is_orphan(BlockId id) const;  // cached, but its parent left the index
  BlockId pop_free_block();     // from the head; evicts its hash
  void push_free_tail(BlockId id);
  void push_free_head(BlockId id);
  void unlink_free(BlockId id);
  void uncache(BlockId id);

  KvCacheConfig config_;
  BlockHash model_root_;  // namespace hash without salt, reused when the salt is empty
  std::vector<BlockMeta> meta_;
  BlockId free_head_ = -1;
  BlockId free_tail_ = -1;
  int num_free_ = 0;
  int num_cached_ = 0;
  std::unordered_map<BlockHash, BlockId, BlockHashHasher> index_;
  std::unordered_map<RequestId, RequestBlocks> requests_;

  // Tiers.
  std::unique_ptr<HostBlockCache> host_;
  bool offload_to_host_ = false;
  size_t block_bytes_ = 0;
  int blocks_per_unit_ = 0;
  std::string store_identity_;  // model identity + device layout, in every store object
  std::unordered_map<BlockHash, PendingStoreRead, BlockHashHasher> pending_reads_;
  std::unordered_map<RequestId, std::vector<BlockHash>> prefetch_keys_;  // until free(id)
  // Store units this process wrote or read, so a shared prefix is not copied and written again.
  std::unordered_set<BlockHash, BlockHashHasher> known_stored_units_;
  KvCacheMetrics counters_;
};

}  // namespace dsinfer::kv
