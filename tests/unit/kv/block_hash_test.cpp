#include "kv/block_hash.h"

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

TEST(BlockHash, ChainDependsOnEveryEarlierBlock) {
  const BlockHash root = namespace_hash("model", "");
  auto a = iota_tokens(12);
  auto b = a;
  b[1] = 99;  // differs only in the first block
  auto ha = chain_hashes(root, a, 4, 3);
  auto hb = chain_hashes(root, b, 4, 3);
  ASSERT_EQ(ha.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_NE(ha[i], hb[i]) << i;
  // Same last block tokens, different history: different hash.
  EXPECT_NE(chain_hash(ha[0], std::span(a).subspan(8, 4)), ha[2]);
  EXPECT_EQ(chain_hash(ha[1], std::span(a).subspan(8, 4)), ha[2]);
}

TEST(BlockHash, DeterministicAndPrefixStable) {
  const BlockHash root = namespace_hash("model", "salt");
  auto t = iota_tokens(20);
  auto h5 = chain_hashes(root, t, 4, 5);
  auto h2 = chain_hashes(root, std::span(t).first(9), 4, 2);
  EXPECT_EQ(h5[0], h2[0]);
  EXPECT_EQ(h5[1], h2[1]);
  EXPECT_EQ(chain_hashes(root, t, 4, 5), h5);
}

TEST(BlockHash, NamespaceSeparatesModelAndSalt) {
  EXPECT_NE(namespace_hash("m", ""), namespace_hash("m", "s"));
  EXPECT_NE(namespace_hash("m1", ""), namespace_hash("m2", ""));
  EXPECT_NE(namespace_hash("ab", "c"), namespace_hash("a", "bc"));
  EXPECT_EQ(namespace_hash("m", "s"), namespace_hash("m", "s"));
}

TEST(BlockHash, HexIs32Digits) {
  BlockHash h{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  EXPECT_EQ(h.to_hex(), "fedcba98765432100123456789abcdef");
}

}  // namespace
}  // namespace dsinfer::kv
