#include "kv/kv_tier_options.h"

#include <gtest/gtest.h>

namespace dsinfer::kv {
namespace {

TEST(KvTierOptions, ParsesSizes) {
  EXPECT_EQ(parse_byte_size("0").value(), 0);
  EXPECT_EQ(parse_byte_size("4096").value(), 4096);
  EXPECT_EQ(parse_byte_size("512M").value(), 512LL << 20);
  EXPECT_EQ(parse_byte_size("64G").value(), 64LL << 30);
  EXPECT_EQ(parse_byte_size("2TiB").value(), 2LL << 40);
  EXPECT_EQ(parse_byte_size("8gb").value(), 8LL << 30);
  for (const char* bad : {"", "G", "-1G", "12X", "1.5G", "10GG", "99999999999T"})
    EXPECT_FALSE(parse_byte_size(bad).ok()) << bad;
}

TEST(KvTierOptions, ParsesDurations) {
  EXPECT_EQ(parse_duration_ms("3d").value(), 3 * kMsPerDay);
  EXPECT_EQ(parse_duration_ms("72h").value(), 3 * kMsPerDay);
  EXPECT_EQ(parse_duration_ms("90m").value(), 90 * 60'000);
  EXPECT_EQ(parse_duration_ms("45s").value(), 45'000);
  for (const char* bad : {"", "3", "d", "0d", "3w", "-1h", "1.5h"})
    EXPECT_FALSE(parse_duration_ms(bad).ok()) << bad;
}

TEST(KvTierOptions, AppliesFlags) {
  KvTierOptions o;
  bool used = false;
  EXPECT_FALSE(o.store_enabled);
  EXPECT_TRUE(apply_kv_flag("--kv-store", "/mnt/shared/kv", &o, &used).value());
  EXPECT_TRUE(used);
  EXPECT_TRUE(o.store_enabled);
  EXPECT_EQ(o.store_directory, "/mnt/shared/kv");
  EXPECT_TRUE(apply_kv_flag("--kv-ttl-agent", "12h", &o, &used).value());
  EXPECT_EQ(o.ttl_agent_ms, 12 * 3'600'000LL);
  EXPECT_TRUE(apply_kv_flag("--kv-host-cache", "8G", &o, &used).value());
  EXPECT_EQ(o.host_cache_bytes, 8LL << 30);
  EXPECT_TRUE(apply_kv_flag("--kv-store-unit", "256", &o, &used).value());
  EXPECT_EQ(o.store_unit_tokens, 256);
  EXPECT_TRUE(apply_kv_flag("--no-kv-store", std::nullopt, &o, &used).value());
  EXPECT_FALSE(used);
  EXPECT_FALSE(o.store_enabled);
  EXPECT_FALSE(apply_kv_flag("--port", "8000", &o, &used).value());  // not ours
  EXPECT_FALSE(used);
  EXPECT_FALSE(apply_kv_flag("--kv-store", std::nullopt, &o, &used).ok());
  EXPECT_FALSE(apply_kv_flag("--kv-ttl-chat", "soon", &o, &used).ok());
  EXPECT_FALSE(apply_kv_flag("--kv-store-unit", "0", &o, &used).ok());
}

TEST(KvTierOptions, OpensTheStoreWithItsRetention) {
  KvTierOptions o;
  EXPECT_EQ(open_block_store(o), nullptr);  // off unless asked for
  o.store_enabled = true;
  o.store_directory = ::testing::TempDir() + "/dsinfer-kv-options-store";
  o.ttl_agent_ms = 1000;
  auto store = open_block_store(o);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->ttl_ms("agent"), 1000);
  EXPECT_EQ(store->ttl_ms("chat"), 7 * kMsPerDay);
  EXPECT_EQ(store->ttl_ms(""), 7 * kMsPerDay);  // unknown classes retain like chat
  o.store_enabled = false;
  EXPECT_EQ(open_block_store(o), nullptr);
}

}  // namespace
}  // namespace dsinfer::kv
