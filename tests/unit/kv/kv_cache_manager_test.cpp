#include "kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace dsinfer::kv {
namespace {

std::vector<TokenId> iota_tokens(int n, int start = 0) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

KvCacheConfig small_config(int num_blocks, int block_size = 4, bool prefix = true) {
  KvCacheConfig c;
  c.num_device_blocks = num_blocks;
  c.block_size_tokens = block_size;
  c.enable_prefix_caching = prefix;
  c.model_identity = "test-model/v1";
  return c;
}

// Runs a request the way the scheduler does: look up, allocate, compute, register.
ComputedPrefix run_prefill(KvCacheManager& m, RequestId id, const std::vector<TokenId>& tokens,
                           const std::string& salt = "") {
  ComputedPrefix p = m.get_computed_blocks(tokens, salt);
  EXPECT_TRUE(m.allocate_slots(id, static_cast<int>(tokens.size()), p));
  m.cache_full_blocks(id, tokens, static_cast<int>(tokens.size()), salt);
  return p;
}

TEST(KvCacheManager, AllocatesCeilBlocksAndFrees) {
  KvCacheManager m(small_config(8));
  EXPECT_EQ(m.num_free_blocks(), 8);
  ASSERT_TRUE(m.allocate_slots(1, 9));
  EXPECT_EQ(m.block_table(1).size(), 3u);
  EXPECT_EQ(m.num_used_blocks(), 3);
  ASSERT_TRUE(m.allocate_slots(1, 12));  // still fits in 3 blocks
  EXPECT_EQ(m.block_table(1).size(), 3u);
  ASSERT_TRUE(m.allocate_slots(1, 13));
  EXPECT_EQ(m.block_table(1).size(), 4u);
  m.free(1);
  EXPECT_EQ(m.num_free_blocks(), 8);
  EXPECT_TRUE(m.block_table(1).empty());
}

TEST(KvCacheManager, OutOfBlocksIsAllOrNothing) {
  KvCacheManager m(small_config(4));
  ASSERT_TRUE(m.allocate_slots(1, 8));
  EXPECT_FALSE(m.allocate_slots(2, 12));  // needs 3, only 2 free
  EXPECT_EQ(m.num_free_blocks(), 2);
  EXPECT_TRUE(m.block_table(2).empty());
  EXPECT_FALSE(m.allocate_slots(1, 20));  // growing request also all or nothing
  EXPECT_EQ(m.block_table(1).size(), 2u);
  EXPECT_TRUE(m.allocate_slots(2, 8));
  EXPECT_EQ(m.num_free_blocks(), 0);
  EXPECT_TRUE(m.allocate_slots(2, 8));  // no new block needed
  EXPECT_FALSE(m.allocate_slots(3, 1));
}

TEST(KvCacheManager, PrefixHitReusesBlocksAndLeavesLastTokenToCompute) {
  KvCacheManager m(small_config(16));
  auto tokens = iota_tokens(10);  // 2 full blocks + 2 tokens
  run_prefill(m, 1, tokens);
  EXPECT_EQ(m.num_cached_blocks(), 2);

  ComputedPrefix p = m.get_computed_blocks(tokens, "");
  ASSERT_EQ(p.blocks.size(), 2u);
  EXPECT_EQ(p.num_tokens, 8);
  EXPECT_EQ(p.blocks[0], m.block_table(1)[0]);
  EXPECT_EQ(p.blocks[1], m.block_table(1)[1]);

  // Exactly 8 tokens: the whole sequence is cached, but one block must be recomputed.
  auto eight = iota_tokens(8);
  EXPECT_EQ(m.get_computed_blocks(eight, "").num_tokens, 4);
  auto nine = iota_tokens(9);
  EXPECT_EQ(m.get_computed_blocks(nine, "").num_tokens, 8);
}

TEST(KvCacheManager, SharedBlocksAreReferenceCounted) {
  KvCacheManager m(small_config(6));
  auto tokens = iota_tokens(9);  // 3 blocks
  run_prefill(m, 1, tokens);
  ComputedPrefix p = run_prefill(m, 2, tokens);
  ASSERT_EQ(p.blocks.size(), 2u);
  EXPECT_EQ(m.block_table(2)[0], m.block_table(1)[0]);
  EXPECT_EQ(m.block_table(2)[1], m.block_table(1)[1]);
  EXPECT_NE(m.block_table(2)[2], m.block_table(1)[2]);
  EXPECT_EQ(m.num_used_blocks(), 4);

  m.free(1);
  // Blocks 0 and 1 are still held by request 2; only request 1's last block came back.
  EXPECT_EQ(m.num_used_blocks(), 3);
  // Filling the pool must not hand out request 2's shared blocks.
  ASSERT_TRUE(m.allocate_slots(3, 12));
  for (BlockId b : m.block_table(3))
    for (BlockId s : m.block_table(2)) EXPECT_NE(b, s);
  EXPECT_EQ(m.num_free_blocks(), 0);
  m.free(2);
  EXPECT_EQ(m.num_free_blocks(), 3);
}

TEST(KvCacheManager, FreeCachedBlocksAreHitAndCountAsFree) {
  KvCacheManager m(small_config(4));
  auto tokens = iota_tokens(9);
  run_prefill(m, 1, tokens);
  m.free(1);
  EXPECT_EQ(m.num_free_blocks(), 4);
  ComputedPrefix p = m.get_computed_blocks(tokens, "");
  EXPECT_EQ(p.num_tokens, 8);
  // Reusing 2 free cached blocks + 2 new ones needs all 4: the prefix blocks must not be
  // counted twice as available.
  ASSERT_TRUE(m.allocate_slots(2, 16, p));
  EXPECT_EQ(m.num_free_blocks(), 0);
  EXPECT_EQ(m.block_table(2)[0], p.blocks[0]);
  m.free(2);
  p = m.get_computed_blocks(tokens, "");
  EXPECT_FALSE(m.allocate_slots(3, 20, p));  // 2 prefix + 3 new > 4
  EXPECT_TRUE(m.block_table(3).empty());
  EXPECT_EQ(m.num_free_blocks(), 4);
  EXPECT_EQ(m.get_computed_blocks(tokens, "").num_tokens, 8);  // nothing evicted by the failure
}

TEST(KvCacheManager, EvictsLeastRecentlyFreedFirst) {
  KvCacheManager m(small_config(4));
  auto a = iota_tokens(5, 0);     // 1 full block
  auto b = iota_tokens(5, 100);
  auto c = iota_tokens(5, 200);
  run_prefill(m, 1, a);
  run_prefill(m, 2, b);
  m.free(1);  // a's block is the oldest cached free block
  m.free(2);
  run_prefill(m, 3, c);  // needs 2 blocks: the blocks without a hash go first
  EXPECT_EQ(m.get_computed_blocks(a, "").num_tokens, 4);
  EXPECT_EQ(m.get_computed_blocks(b, "").num_tokens, 4);
  // Now only cached blocks are free; one more block must evict a (the LRU), not b.
  ASSERT_TRUE(m.allocate_slots(4, 4));
  EXPECT_EQ(m.get_computed_blocks(a, "").num_tokens, 0);
  EXPECT_EQ(m.get_computed_blocks(b, "").num_tokens, 4);
  // A hit moves b out of the LRU; when freed again it becomes the most recent.
  m.free(4);
  run_prefill(m, 5, b);
  m.free(5);
  m.free(3);  // c's block is now more recent than b's
  // Queue now: two uncached blocks, then b's, then c's. Three blocks reach b but not c.
  ASSERT_TRUE(m.allocate_slots(6, 12));
  EXPECT_EQ(m.get_computed_blocks(b, "").num_tokens, 0);
  EXPECT_EQ(m.get_computed_blocks(c, "").num_tokens, 4);
}

TEST(KvCacheManager, TailBlocksOfARequestAreEvictedBeforeItsHead) {
  KvCacheManager m(small_config(3));
  auto t = iota_tokens(12);  // 3 full blocks, all cached
  run_prefill(m, 1, t);
  m.free(1);
  auto longer = iota_tokens(13);
  EXPECT_EQ(m.get_computed_blocks(longer, "").num_tokens, 12);
  ASSERT_TRUE(m.allocate_slots(2, 1));
  EXPECT_EQ(m.get_computed_blocks(longer, "").num_tokens, 8);
  ASSERT_TRUE(m.allocate_slots(3, 1));
  EXPECT_EQ(m.get_computed_blocks(longer, "").num_tokens, 4);
}

TEST(KvCacheManager, SaltIsolatesPrefixes) {
  KvCacheManager m(small_config(8));
  auto t = iota_tokens(9);
  run_prefill(m, 1, t, "tenant-a");
  EXPECT_EQ(m.get_computed_blocks(t, "tenant-a").num_tokens, 8);
  EXPECT_EQ(m.get_computed_blocks(t, "tenant-b").num_tokens, 0);
  EXPECT_EQ(m.get_computed_blocks(t, "").num_tokens, 0);
}

TEST(KvCacheManager, ModelIdentityIsPartOfTheNamespace) {
  // Same tokens in two managers of different identity give different hashes; checked through
  // the hash function the manager uses.
  auto t = iota_tokens(4);
  EXPECT_NE(chain_hash(namespace_hash("a", ""), t), chain_hash(namespace_hash("b", ""), t));
}

TEST(KvCacheManager, DivergingSuffixSharesOnlyCommonBlocks) {
  KvCacheManager m(small_config(16));
  auto a = iota_tokens(13);
  auto b = a;
  b[9] = 1000;  // differs in block 2
  run_prefill(m, 1, a);
  ComputedPrefix p = m.get_computed_blocks(b, "");
  EXPECT_EQ(p.num_tokens, 8);
  run_prefill(m, 2, b);
  EXPECT_EQ(m.get_computed_blocks(b, "").num_tokens, 12);
  EXPECT_EQ(m.get_computed_blocks(a, "").num_tokens, 12);
}

TEST(KvCacheManager, CacheFullBlocksIsIdempotentAndIncremental) {
  KvCacheManager m(small_config(8));
  auto t = iota_tokens(12);
  ASSERT_TRUE(m.allocate_slots(1, 12));
  m.cache_full_blocks(1, t, 5, "");  // chunked prefill: only block 0 is complete
  EXPECT_EQ(m.num_cached_blocks(), 1);
  m.cache_full_blocks(1, t, 5, "");
  EXPECT_EQ(m.num_cached_blocks(), 1);
  m.cache_full_blocks(1, t, 12, "");
  EXPECT_EQ(m.num_cached_blocks(), 3);
  m.cache_full_blocks(1, t, 12, "");
  EXPECT_EQ(m.num_cached_blocks(), 3);
  std::vector<TokenId> longer = t;
  longer.push_back(77);
  EXPECT_EQ(m.get_computed_blocks(longer, "").num_tokens, 12);
}

TEST(KvCacheManager, DecodeBlocksBecomeCacheable) {
  KvCacheManager m(small_config(8));
  std::vector<TokenId> t = iota_tokens(6);
  ASSERT_TRUE(m.allocate_slots(1, 6));
  m.cache_full_blocks(1, t, 6, "");
  for (TokenId next = 500; next < 503; ++next) {  // three decode steps
    t.push_back(next);
    ASSERT_TRUE(m.allocate_slots(1, static_cast<int>(t.size())));
    m.cache_full_blocks(1, t, static_cast<int>(t.size()), "");
  }
  EXPECT_EQ(m.num_cached_blocks(), 2);
  t.push_back(1);
  EXPECT_EQ(m.get_computed_blocks(t, "").num_tokens, 8);
}

TEST(KvCacheManager, DuplicateComputationKeepsOneIndexedCopy) {
  KvCacheManager m(small_config(8));
  auto t = iota_tokens(9);
  // Two requests with the same prompt scheduled in the same step: neither sees the other's
  // blocks at lookup time.
  ASSERT_TRUE(m.allocate_slots(1, 9));
  ASSERT_TRUE(m.allocate_slots(2, 9));
  m.cache_full_blocks(1, t, 9, "");
  m.cache_full_blocks(2, t, 9, "");
  EXPECT_EQ(m.num_cached_blocks(), 2);
  // Request 2 continues and its third block chains after request 1's indexed blocks.
  std::vector<TokenId> longer = iota_tokens(13);
  ASSERT_TRUE(m.allocate_slots(2, 13));
  m.cache_full_blocks(2, longer, 13, "");
  EXPECT_EQ(m.num_cached_blocks(), 3);
  longer.push_back(0);
  ComputedPrefix p = m.get_computed_blocks(longer, "");
  EXPECT_EQ(p.num_tokens, 12);
  EXPECT_EQ(p.blocks[0], m.block_table(1)[0]);
  EXPECT_EQ(p.blocks[2], m.block_table(2)[2]);
  m.free(1);
  m.free(2);
  EXPECT_EQ(m.num_free_blocks(), 8);
}

TEST(KvCacheManager, StaleLookupIsRefused) {
  KvCacheManager m(small_config(2));
  auto a = iota_tokens(5);
  run_prefill(m, 1, a);
  m.free(1);
  ComputedPrefix p = m.get_computed_blocks(a, "");
  ASSERT_EQ(p.num_tokens, 4);
  ASSERT_TRUE(m.allocate_slots(2, 8));  // evicts a's cached block in between
  m.free(2);
  EXPECT_FALSE(m.allocate_slots(3, 5, p));
  EXPECT_TRUE(m.block_table(3).empty());
  EXPECT_EQ(m.num_free_blocks(), 2);
}

TEST(KvCacheManager, ChildOfEvictedParentIsNotReachableAndIsReplaced) {
  KvCacheManager m(small_config(8));
  auto t9 = iota_tokens(9);
  auto t13 = iota_tokens(13);
  auto t14 = iota_tokens(14);
  // Two copies of the same prefix; request 2's third block is indexed after request 1's
  // second block.
  ASSERT_TRUE(m.allocate_slots(1, 9));
  ASSERT_TRUE(m.allocate_slots(2, 9));
  m.cache_full_blocks(1, t9, 9, "");
  m.cache_full_blocks(2, t9, 9, "");
  ASSERT_TRUE(m.allocate_slots(2, 13));
  m.cache_full_blocks(2, t13, 13, "");
  ASSERT_EQ(m.get_computed_blocks(t14, "").num_tokens, 12);
  const BlockId child = m.block_table(2)[2];
  m.free(1);
  ASSERT_TRUE(m.allocate_slots(3, 16));  // evicts request 1's indexed blocks (the parents)
  m.free(3);
  EXPECT_EQ(m.get_computed_blocks(t14, "").num_tokens, 0);
  // The prefix is computed again in other blocks: the orphan child must not be linked to
  // the new parent without proof...
  run_prefill(m, 4, t9);
  EXPECT_EQ(m.get_computed_blocks(t14, "").num_tokens, 8);
  // ...and a request that recomputes the third block takes over its index slot.
  ASSERT_TRUE(m.allocate_slots(4, 13));
  m.cache_full_blocks(4, t13, 13, "");
  ComputedPrefix p = m.get_computed_blocks(t14, "");
  EXPECT_EQ(p.num_tokens, 12);
  EXPECT_EQ(p.blocks[2], m.block_table(4)[2]);
  EXPECT_NE(p.blocks[2], child);
  m.free(2);
  m.free(4);
  EXPECT_EQ(m.num_free_blocks(), 8);
}

TEST(KvCacheManager, DisabledPrefixCachingNeverHits) {
  KvCacheManager m(small_config(8, 4, false));
  auto t = iota_tokens(9);
  run_prefill(m, 1, t);
  EXPECT_EQ(m.num_cached_blocks(), 0);
  EXPECT_EQ(m.get_computed_blocks(t, "").num_tokens, 0);
}

TEST(KvCacheManager, UnknownRequestsAreHarmless) {
  KvCacheManager m(small_config(2));
  m.free(42);
  auto t = iota_tokens(4);
  m.cache_full_blocks(42, t, 4, "");
  EXPECT_TRUE(m.block_table(42).empty());
  EXPECT_EQ(m.num_free_blocks(), 2);
  EXPECT_EQ(m.get_computed_blocks({}, "").num_tokens, 0);
}

TEST(KvCacheManager, RandomizedInvariants) {
  // Random workload: counts always add up and no block is owned twice unless it is cached.
  KvCacheManager m(small_config(32));
  std::vector<std::vector<TokenId>> prompts;
  for (int p = 0; p < 6; ++p) prompts.push_back(iota_tokens(6 + 5 * p, p % 3 == 0 ? 0 : 1000 * p));
  uint32_t rng = 12345;
  auto next = [&] { rng = rng * 1664525u + 1013904223u; return rng >> 8; };
  std::vector<RequestId> live;
  for (RequestId id = 1; id < 400; ++id) {
    if (!live.empty() && next() % 3 == 0) {
      size_t k = next() % live.size();
      m.free(live[k]);
      live.erase(live.begin() + k);
      continue;
    }
    const auto& t = prompts[next() % prompts.size()];
    ComputedPrefix p = m.get_computed_blocks(t, "");
    if (!m.allocate_slots(id, static_cast<int>(t.size()), p)) continue;
    m.cache_full_blocks(id, t, static_cast<int>(t.size()), "");
    live.push_back(id);
    std::vector<int> owners(32, 0);
    for (RequestId r : live)
      for (BlockId b : m.block_table(r)) owners[b]++;
    int used = 0;
    for (int c : owners) used += c > 0;
    ASSERT_EQ(used, m.num_used_blocks());
    ASSERT_EQ(m.num_used_blocks() + m.num_free_blocks(), 32);
  }
  for (RequestId r : live) m.free(r);
  EXPECT_EQ(m.num_free_blocks(), 32);
}

}  // namespace
}  // namespace dsinfer::kv
