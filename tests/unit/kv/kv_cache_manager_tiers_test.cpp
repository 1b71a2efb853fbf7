// The host and store tiers through KvCacheManager, with a fake device whose KV for a token is
// a pure function of the prefix up to it, like a real model's. A request's KV after a hit in
// any tier must equal what computing it cold gives.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fcntl.h>
#include <sys/stat.h>

#include <fstream>
#include <numeric>
#include <thread>

#include "kv/kv_cache_manager.h"
#include "temp_dir.h"

namespace dsinfer::kv {
namespace {

namespace fs = std::filesystem;

constexpr int kBlockTokens = 4;
constexpr int kBytesPerToken = 16;
constexpr int kUnitTokens = 8;  // two device blocks per store unit

// The "model": KV bytes of position p depend on tokens [0, p] only.
uint64_t kv_value(std::span<const TokenId> tokens, size_t p) {
  return XXH3_64bits(tokens.data(), (p + 1) * sizeof(TokenId));
}

class FakeDevice final : public KvBlockIo {
 public:
  explicit FakeDevice(int num_blocks) : mem_(static_cast<size_t>(num_blocks) * block_bytes()) {}
  size_t block_bytes() const override { return kBlockTokens * kBytesPerToken; }
  void read_block(BlockId id, std::byte* dst) override {
    std::memcpy(dst, mem_.data() + id * block_bytes(), block_bytes());
    ++num_reads;
  }
  void write_block(BlockId id, const std::byte* src) override {
    std::memcpy(mem_.data() + id * block_bytes(), src, block_bytes());
    ++num_writes;
  }
  // The forward pass for positions [from, to): writes their KV into the block table.
  void compute(const std::vector<BlockId>& table, std::span<const TokenId> tokens, int from, int to) {
    for (int p = from; p < to; ++p) {
      const uint64_t v = kv_value(tokens, p);
      std::byte* slot = mem_.data() + table[p / kBlockTokens] * block_bytes() + (p % kBlockTokens) * kBytesPerToken;
      std::memcpy(slot, &v, 8);
      std::memcpy(slot + 8, &v, 8);
    }
    num_computed_tokens += to - from;
  }
  // True if every position [0, n) holds the KV a cold computation gives.
  bool kv_matches(const std::vector<BlockId>& table, std::span<const TokenId> tokens, int n) const {
    for (int p = 0; p < n; ++p) {
      const uint64_t want = kv_value(tokens, p);
      const std::byte* slot = mem_.data() + table[p / kBlockTokens] * block_bytes() + (p % kBlockTokens) * kBytesPerToken;
      uint64_t a, b;
      std::memcpy(&a, slot, 8);
      std::memcpy(&b, slot + 8, 8);
      if (a != want || b != want) return false;
    }
    return true;
  }
  int num_reads = 0;
  int num_writes = 0;
  int num_computed_tokens = 0;

 private:
  std::vector<std::byte> mem_;
};

using test_support::TempDir;

std::vector<TokenId> tokens_of(int n, int seed) {
  std::vector<TokenId> t(n);
  for (int i = 0; i < n; ++i) t[i] = seed * 7919 + i * 13;
  return t;
}

std::shared_ptr<KvBlockStore> make_store(const std::string& dir) {
  KvBlockStoreConfig c;
  c.directory = dir;
  c.janitor_interval_ms = 0;
  return std::make_shared<KvBlockStore>(c);
}

KvCacheConfig tier_config(FakeDevice& dev, int num_blocks, int64_t host_bytes, std::shared_ptr<KvBlockStore> store) {
  KvCacheConfig c;
  c.num_device_blocks = num_blocks;
  c.block_size_tokens = kBlockTokens;
  c.model_identity = "fake-model";
  c.block_io = &dev;
  c.host_cache_bytes = host_bytes;
  c.store = std::move(store);
  c.store_unit_tokens = kUnitTokens;
  return c;
}

// One request as the engine runs it: prefetch, wait, look up, allocate, compute the rest,
// register. Returns the lookup's stats; the KV is checked against a cold computation.
PromptCacheStats run_request(KvCacheManager& m, FakeDevice& dev, RequestId id, const std::vector<TokenId>& t,
                             const std::string& salt = "", bool keep = false) {
  m.prefetch(id, t, salt);
  while (!m.prefetch_ready(id)) std::this_thread::yield();
  ComputedPrefix p = m.get_computed_blocks(t, salt);
  EXPECT_TRUE(m.allocate_slots(id, static_cast<int>(t.size()), p));
  dev.compute(m.block_table(id), t, p.num_tokens, static_cast<int>(t.size()));
  m.cache_full_blocks(id, t, static_cast<int>(t.size()), salt);
  EXPECT_TRUE(dev.kv_matches(m.block_table(id), t, static_cast<int>(t.size())));
  if (!keep) m.free(id);
  return p.stats;
}

TEST(KvCacheManagerTiers, HostTierRestoresEvictedBlocks) {
  FakeDevice dev(4);
  KvCacheManager m(tier_config(dev, 4, 1 << 20, nullptr));
  auto a = tokens_of(13, 1);  // 3 full blocks + 1 token: all 4 device blocks
  PromptCacheStats cold = run_request(m, dev, 1, a);
  EXPECT_EQ(cold.num_cached_tokens(), 0);
  EXPECT_EQ(cold.num_prompt_tokens, 13);
  run_request(m, dev, 2, tokens_of(13, 2));  // evicts all of a's blocks
  EXPECT_EQ(m.get_computed_blocks(a, "").blocks.size(), 0u);
  EXPECT_EQ(m.metrics().num_blocks_offloaded, 3);

  const int computed_before = dev.num_computed_tokens;
  PromptCacheStats hit = run_request(m, dev, 3, a);
  EXPECT_EQ(hit.num_host_hit_tokens, 12);
  EXPECT_EQ(hit.num_device_hit_tokens, 0);
  EXPECT_EQ(dev.num_computed_tokens - computed_before, 1);
  // Restored blocks are indexed on the device again.
  ComputedPrefix again = m.get_computed_blocks(a, "");
  EXPECT_EQ(again.blocks.size(), 3u);
  EXPECT_EQ(again.stats.num_device_hit_tokens, 12);
}

TEST(KvCacheManagerTiers, DeviceThenHostInOneLookup) {
  FakeDevice dev(6);
  KvCacheManager m(tier_config(dev, 6, 1 << 20, nullptr));
  auto a = tokens_of(17, 3);  // 4 full blocks + 1 token: 5 blocks
  run_request(m, dev, 1, a);
  // Free queue: a's uncached last block, the never-used block, then a's blocks 3, 2, 1, 0.
  // Four new blocks evict blocks 3 and 2 to the host; blocks 0 and 1 stay on the device.
  ASSERT_TRUE(m.allocate_slots(2, 16));
  m.free(2);
  PromptCacheStats s = run_request(m, dev, 3, a);
  EXPECT_EQ(s.num_device_hit_tokens, 8);
  EXPECT_EQ(s.num_host_hit_tokens, 8);
}

TEST(KvCacheManagerTiers, HostTierIsBoundedInBytes) {
  FakeDevice dev(4);
  KvCacheManager m(tier_config(dev, 4, 2 * dev.block_bytes(), nullptr));
  auto a = tokens_of(13, 1);
  run_request(m, dev, 1, a);
  run_request(m, dev, 2, tokens_of(13, 2));
  auto met = m.metrics();
  EXPECT_EQ(met.num_host_blocks, 2);
  EXPECT_LE(met.host_bytes_used, met.host_capacity_bytes);
  EXPECT_EQ(met.num_host_evictions, 1);
  // A request's blocks are evicted tail first, so the host keeps the head of the prefix,
  // the part other requests can use.
  ComputedPrefix p = m.get_computed_blocks(a, "");
  EXPECT_EQ(p.num_tokens, 8);
  EXPECT_EQ(p.stats.num_host_hit_tokens, 8);
}

TEST(KvCacheManagerTiers, StoreHitInAnotherManager) {
  TempDir dir;
  auto t = tokens_of(21, 5);  // 2 full store units (16 tokens) + 5
  FakeDevice dev1(16);
  {
    KvCacheManager m1(tier_config(dev1, 16, 0, make_store(dir.path())));
    run_request(m1, dev1, 1, t);
    EXPECT_EQ(m1.metrics().num_store_units_queued, 2);
  }  // the store finishes its writes when the last owner lets go
  FakeDevice dev2(16);
  auto store2 = make_store(dir.path());
  KvCacheManager m2(tier_config(dev2, 16, 0, store2));
  EXPECT_EQ(m2.prefetch(7, t, ""), 2);
  PromptCacheStats s = run_request(m2, dev2, 7, t);
  EXPECT_EQ(s.num_store_hit_tokens, 16);
  EXPECT_EQ(s.num_cached_tokens(), 16);
  EXPECT_EQ(dev2.num_computed_tokens, 5);
  auto met = m2.metrics();
  EXPECT_EQ(met.num_store_hit_tokens, 16);
  EXPECT_EQ(met.num_prompt_tokens, 21);
  EXPECT_EQ(met.num_computed_tokens(), 5);
  EXPECT_EQ(met.store.num_read_hits, 2);
  EXPECT_GT(met.store.bytes_read, 0);
  // Units it read are not written back.
  EXPECT_EQ(met.num_store_units_queued, 0);
  // A second request in m2 now hits on the device.
  PromptCacheStats s2 = run_request(m2, dev2, 8, t);
  EXPECT_EQ(s2.num_device_hit_tokens, 20);
}

TEST(KvCacheManagerTiers, StoreRespectsSaltAndModelIdentity) {
  TempDir dir;
  auto t = tokens_of(17, 6);
  FakeDevice dev1(16);
  {
    KvCacheManager m1(tier_config(dev1, 16, 0, make_store(dir.path())));
    run_request(m1, dev1, 1, t, "tenant-a");
  }
  FakeDevice dev2(16);
  KvCacheManager m2(tier_config(dev2, 16, 0, make_store(dir.path())));
  EXPECT_EQ(run_request(m2, dev2, 1, t, "tenant-b").num_store_hit_tokens, 0);
  EXPECT_EQ(run_request(m2, dev2, 2, t, "").num_store_hit_tokens, 0);
  FakeDevice dev3(16);
  KvCacheConfig other = tier_config(dev3, 16, 0, make_store(dir.path()));
  other.model_identity = "another-model";
  KvCacheManager m3(other);
  EXPECT_EQ(run_request(m3, dev3, 1, t, "tenant-a").num_store_hit_tokens, 0);
  FakeDevice dev4(16);
  KvCacheManager m4(tier_config(dev4, 16, 0, make_store(dir.path())));
  EXPECT_EQ(run_request(m4, dev4, 1, t, "tenant-a").num_store_hit_tokens, 16);
}

TEST(KvCacheManagerTiers, CorruptStoreObjectIsRecomputed) {
  TempDir dir;
  auto t = tokens_of(17, 8);
  FakeDevice dev1(16);
  std::string victim;
  {
    auto store = make_store(dir.path());
    KvCacheManager m1(tier_config(dev1, 16, 0, store));
    run_request(m1, dev1, 1, t);
    store->flush();
  }
  // Corrupt the second unit's object (keep its times: they hold the expiry).
  for (auto& e : fs::recursive_directory_iterator(dir.path())) {
    if (e.path().extension() != ".kvb") continue;
    if (fs::file_size(e.path()) > fs::file_size(victim.empty() ? e.path() : fs::path(victim)) || victim.empty())
      victim = e.path().string();  // the larger object holds more tokens: the second unit
  }
  ASSERT_FALSE(victim.empty());
  struct stat st;
  ::stat(victim.c_str(), &st);
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  const timespec times[2] = {st.st_atim, st.st_mtim};
  ::utimensat(AT_FDCWD, victim.c_str(), times, 0);

  FakeDevice dev2(16);
  auto store2 = make_store(dir.path());
  KvCacheManager m2(tier_config(dev2, 16, 0, store2));
  PromptCacheStats s = run_request(m2, dev2, 1, t);
  EXPECT_EQ(s.num_store_hit_tokens, 8);  // the first unit only
  EXPECT_EQ(dev2.num_computed_tokens, 9);
  EXPECT_EQ(m2.metrics().store.num_removed_corrupt, 1);
  // The recomputed unit was written again: a third manager hits both units.
  store2->flush();
  EXPECT_EQ(m2.metrics().store.num_writes, 1);
  FakeDevice dev3(16);
  KvCacheManager m3(tier_config(dev3, 16, 0, make_store(dir.path())));
  EXPECT_EQ(run_request(m3, dev3, 1, t).num_store_hit_tokens, 16);
}

TEST(KvCacheManagerTiers, PrefetchSkipsWhatDeviceAndHostHold) {
  TempDir dir;
  FakeDevice dev(16);
  KvCacheManager m(tier_config(dev, 16, 1 << 20, make_store(dir.path())));
  auto t = tokens_of(25, 9);  // 3 store units before the last token
  run_request(m, dev, 1, t);
  EXPECT_EQ(m.prefetch(2, t, ""), 0);
  EXPECT_TRUE(m.prefetch_ready(2));
  auto longer = t;
  for (int i = 0; i < 16; ++i) longer.push_back(i);  // 2 more units: not on the device
  EXPECT_EQ(m.prefetch(3, longer, ""), 2);
  while (!m.prefetch_ready(3)) std::this_thread::yield();
  m.free(2);
  m.free(3);
}

TEST(KvCacheManagerTiers, ShortPromptNeverReadsTheStore) {
  TempDir dir;
  FakeDevice dev(16);
  KvCacheManager m(tier_config(dev, 16, 0, make_store(dir.path())));
  EXPECT_EQ(m.prefetch(1, tokens_of(8, 1), ""), 0);  // one unit, but it holds the last token
  EXPECT_EQ(m.prefetch(1, tokens_of(9, 1), ""), 1);
}

TEST(KvCacheManagerTiers, AccountingAddsUpOverRequests) {
  FakeDevice dev(8);
  KvCacheManager m(tier_config(dev, 8, 1 << 20, nullptr));
  auto a = tokens_of(9, 1);
  run_request(m, dev, 1, a);           // cold: 9 computed
  run_request(m, dev, 2, a);           // device hit 8
  run_request(m, dev, 3, tokens_of(29, 2));  // evicts a's blocks into the host tier
  run_request(m, dev, 4, a);           // host hit 8
  auto met = m.metrics();
  EXPECT_EQ(met.num_prompt_tokens, 9 + 9 + 29 + 9);
  EXPECT_EQ(met.num_device_hit_tokens, 8);
  EXPECT_EQ(met.num_host_hit_tokens, 8);
  EXPECT_EQ(met.num_store_hit_tokens, 0);
  EXPECT_EQ(met.num_computed_tokens(), dev.num_computed_tokens);
}

// Prompts that share prefixes of different lengths, a pool too small to keep them all, the
// given tiers, requests that overlap in time: every request must end up with exactly the KV a
// cold computation gives, and the pool must balance at the end.
void run_randomized_workload(bool with_store) {
  TempDir dir;
  FakeDevice dev(24);
  // Without a store the host tier holds 6 blocks, so it evicts too; with one, store reads are
  // staged in a larger host area.
  KvCacheManager m(tier_config(dev, 24, 6 * dev.block_bytes(), with_store ? make_store(dir.path()) : nullptr));
  std::vector<std::vector<TokenId>> prompts;
  for (int family = 0; family < 4; ++family) {
    const auto base = tokens_of(40, family);
    for (int cut : {9, 17, 26, 33}) {
      auto p = std::vector<TokenId>(base.begin(), base.begin() + cut);
      p.push_back(1000 + cut);  // diverge after the shared part
      prompts.push_back(p);
    }
  }
  uint32_t rng = 99;
  auto next = [&] { rng = rng * 1664525u + 1013904223u; return rng >> 8; };
  std::vector<std::pair<RequestId, const std::vector<TokenId>*>> live;
  int num_hits = 0;
  for (RequestId id = 1; id < 300; ++id) {
    if (!live.empty() && (next() % 2 == 0 || live.size() > 3)) {
      const size_t k = next() % live.size();
      auto [rid, t] = live[k];
      EXPECT_TRUE(dev.kv_matches(m.block_table(rid), *t, static_cast<int>(t->size()))) << rid;
      m.free(rid);
      live.erase(live.begin() + static_cast<long>(k));
    }
    const auto& t = prompts[next() % prompts.size()];
    m.prefetch(id, t, "");
    if (next() % 2) m.wait_for_prefetch(id, 1000);  // sometimes admit before the reads finish
    ComputedPrefix p = m.get_computed_blocks(t, "");
    if (!m.allocate_slots(id, static_cast<int>(t.size()), p)) {
      m.free(id);
      continue;
    }
    num_hits += p.num_tokens > 0;
    dev.compute(m.block_table(id), t, p.num_tokens, static_cast<int>(t.size()));
    m.cache_full_blocks(id, t, static_cast<int>(t.size()), "");
    EXPECT_TRUE(dev.kv_matches(m.block_table(id), t, static_cast<int>(t.size()))) << id;
    live.emplace_back(id, &t);
  }
  for (auto [rid, t] : live) m.free(rid);
  EXPECT_EQ(m.num_free_blocks(), 24);
  EXPECT_GT(num_hits, 100);
  const KvCacheMetrics met = m.metrics();
  EXPECT_GT(met.num_device_hit_tokens, 0);
  EXPECT_GT(met.num_host_hit_tokens + met.num_store_hit_tokens, 0);
  EXPECT_LE(met.host_bytes_used, met.host_capacity_bytes);
  if (!with_store) {
    EXPECT_GT(met.num_host_evictions, 0);
  }
}

TEST(KvCacheManagerTiers, RandomizedWorkloadWithHostTier) { run_randomized_workload(false); }
TEST(KvCacheManagerTiers, RandomizedWorkloadWithStore) { run_randomized_workload(true); }

TEST(KvCacheManagerTiers, TiersNeedBlockIo) {
  KvCacheConfig c;
  c.num_device_blocks = 4;
  c.host_cache_bytes = 1024;
  EXPECT_THROW(KvCacheManager m(c), Error);
}

}  // namespace
}  // namespace dsinfer::kv
