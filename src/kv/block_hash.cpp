#include "kv/block_hash.h"

// The streaming state is only complete with static linking definitions.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "core/check.h"

namespace dsinfer::kv {
namespace {

BlockHash from_xxh(XXH128_hash_t h) { return BlockHash{h.low64, h.high64}; }

}  // namespace

std::string BlockHash::to_hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[15 - i] = kDigits[(high >> (4 * i)) & 0xf];
    out[31 - i] = kDigits[(low >> (4 * i)) & 0xf];
  }
  return out;
}

BlockHash namespace_hash(std::string_view model_identity, std::string_view cache_salt) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  // Length prefixes keep ("ab","c") and ("a","bc") apart.
  const uint64_t lens[2] = {model_identity.size(), cache_salt.size()};
  XXH3_128bits_update(&state, lens, sizeof(lens));
  XXH3_128bits_update(&state, model_identity.data(), model_identity.size());
  XXH3_128bits_update(&state, cache_salt.data(), cache_salt.size());
  return from_xxh(XXH3_128bits_digest(&state));
}

BlockHash chain_hash(const BlockHash& parent, std::span<const TokenId> tokens) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  const uint64_t words[2] = {parent.low, parent.high};
  XXH3_128bits_update(&state, words, sizeof(words));
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  return from_xxh(XXH3_128bits_digest(&state));
}

std::vector<BlockHash> chain_hashes(const BlockHash& root, std::span<const TokenId> tokens,
                                    int block_size_tokens, int num_blocks) {
  DS_CHECK(block_size_tokens > 0 && num_blocks >= 0);
  DS_CHECK(static_cast<size_t>(num_blocks) * block_size_tokens <= tokens.size());
  std::vector<BlockHash> out;
  out.reserve(num_blocks);
  BlockHash parent = root;
  for (int i = 0; i < num_blocks; ++i) {
    parent = chain_hash(parent, tokens.subspan(static_cast<size_t>(i) * block_size_tokens, block_size_tokens));
    out.push_back(parent);
  }
  return out;
}

}  // namespace dsinfer::kv
