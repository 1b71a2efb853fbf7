// Chain hashes that name KV blocks across every cache tier.
//
// A block's hash covers its parent's hash and its own token ids, so equal hashes mean equal
// prefixes (up to a 128-bit XXH3 collision, which the tiers rule out by comparing stored
// token ids). The chain starts from a namespace hash of the model identity and the request's
// optional cache salt: requests with different salts or models never share a block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsinfer/engine_types.h"

namespace dsinfer::kv {

struct BlockHash {
  uint64_t low = 0;
  uint64_t high = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
  std::string to_hex() const;  // 32 lowercase hex digits, high half first
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.low ^ (h.high * 0x9e3779b97f4a7c15ULL)); }
};

// The root of a chain: hash of (model identity, cache salt). Distinct pairs give distinct roots
// because both strings are length-prefixed before hashing.
BlockHash namespace_hash(std::string_view model_identity, std::string_view cache_salt);

// hash(parent, tokens): one link of the chain.
BlockHash chain_hash(const BlockHash& parent, std::span<const TokenId> tokens);

// Hashes of the first `num_blocks` full blocks of `tokens` (num_blocks * block_size_tokens must
// not exceed tokens.size()), chained from `root`.
std::vector<BlockHash> chain_hashes(const BlockHash& root, std::span<const TokenId> tokens,
                                    int block_size_tokens, int num_blocks);

}  // namespace dsinfer::kv
