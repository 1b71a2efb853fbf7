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
// - Not thread-safe: one engine thread drives it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "dsinfer/engine_types.h"
#include "kv/block_hash.h"

namespace dsinfer::kv {

using BlockId = int32_t;

struct KvCacheConfig {
  int num_device_blocks = 0;
  int block_size_tokens = 64;          // device block (the attention kernels' page size)
  bool enable_prefix_caching = true;
  std::string model_identity;          // namespace of the hash chain (model name + layout)
};

// A cached prefix found by get_computed_blocks: `blocks` hold its first num_tokens tokens.
struct ComputedPrefix {
  std::vector<BlockId> blocks;
  int num_tokens = 0;
  // The blocks' generations at lookup time; allocate_slots uses them to notice a block that
  // was evicted and reused in between. Filled by get_computed_blocks.
  std::vector<uint32_t> generations;
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
  void cache_full_blocks(RequestId id, std::span<const TokenId> tokens, int num_computed_tokens,
                         const std::string& cache_salt);

  void free(RequestId id);  // blocks return to the pool; cached ones enter the LRU tail

  int num_free_blocks() const;   // free + evictable
  int num_used_blocks() const;
  int num_total_blocks() const;
  int block_size_tokens() const;
  int num_cached_blocks() const;  // blocks currently in the prefix index (used or free)

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
  };

  bool block_matches(BlockId id, std::span<const TokenId> tokens, BlockId parent,
                     const std::string& cache_salt) const;
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
};

}  // namespace dsinfer::kv
