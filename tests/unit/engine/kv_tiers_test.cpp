// The KV cache tiers under the real engine: greedy outputs after a prefix hit in each tier
// (device, host, block store) equal the cold run's and follow the HF reference of the golden
// fixtures; the hit counts land in the request's usage.
#include <gtest/gtest.h>

#include "dsinfer/llm.h"
#include "engine/engine_core.h"
#include "temp_dir.h"
#include "test_fixtures.h"

namespace dsinfer {
namespace {

constexpr const char* kFixture = "tiny_v3";

using test_support::TempDir;

EngineConfig tier_config() {
  EngineConfig c = testing::fixture_engine_config(kFixture);
  c.block_size_tokens = 16;
  c.kv_tiers.store_unit_tokens = 32;
  return c;
}

struct Prompt {
  GenerationRequest request;
  std::vector<TokenId> greedy_ids;
  std::vector<double> margins;
};

// The fixture's longest prompt (130 tokens: 8 full blocks, 4 store units before its last token).
Prompt long_prompt() {
  const auto ref = testing::fixture_reference(kFixture);
  const nlohmann::json* best = nullptr;
  for (const auto& p : ref["prompts"])
    if (!best || p["prompt_ids"].size() > (*best)["prompt_ids"].size()) best = &p;
  Prompt out;
  out.request.prompt_ids = (*best)["prompt_ids"].get<std::vector<TokenId>>();
  out.request.sampling.temperature = 0.0f;
  out.request.sampling.ignore_eos = true;
  out.request.sampling.max_tokens = ref["num_greedy_tokens"].get<int>();
  out.greedy_ids = (*best)["greedy_ids"].get<std::vector<TokenId>>();
  out.margins = (*best)["greedy_margins"].get<std::vector<double>>();
  return out;
}

// Another prompt of the same length that shares no block with `p`.
GenerationRequest other_prompt(const Prompt& p) {
  GenerationRequest r = p.request;
  for (TokenId& t : r.prompt_ids) t = (t + 101) % 512;
  return r;
}

Completion run_one(LLM& llm, const GenerationRequest& r) {
  auto results = llm.generate({r});
  EXPECT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].status.ok()) << results[0].status.to_string();
  return results[0];
}

void expect_follows_reference(const Completion& c, const Prompt& p) {
  EXPECT_GE(testing::agreeing_prefix(c.token_ids, p.greedy_ids, p.margins), 0);
}

TEST(KvTiersEngine, DeviceHitGivesTheColdOutput) {
  const Prompt p = long_prompt();
  LLM llm(tier_config());
  const Completion cold = run_one(llm, p.request);
  EXPECT_EQ(cold.prompt_cache.num_cached_tokens(), 0);
  expect_follows_reference(cold, p);
  const Completion hit = run_one(llm, p.request);
  EXPECT_EQ(hit.prompt_cache.num_device_hit_tokens, 128);
  EXPECT_EQ(hit.prompt_cache.num_prompt_tokens, 130);
  EXPECT_EQ(hit.token_ids, cold.token_ids);
}

TEST(KvTiersEngine, HostHitGivesTheColdOutput) {
  const Prompt p = long_prompt();
  EngineConfig c = tier_config();
  c.num_kv_blocks = 16;  // one 154-token request holds 10 of them
  c.kv_tiers.host_cache_bytes = 64 << 20;
  LLM llm(c);
  const Completion cold = run_one(llm, p.request);
  run_one(llm, other_prompt(p));  // evicts part of the first prompt's blocks to the host tier
  const Completion hit = run_one(llm, p.request);
  EXPECT_GT(hit.prompt_cache.num_host_hit_tokens, 0);
  EXPECT_EQ(hit.prompt_cache.num_cached_tokens(), 128);
  EXPECT_EQ(hit.token_ids, cold.token_ids);
  expect_follows_reference(hit, p);
  EXPECT_GT(llm.engine().kv_cache().metrics().num_blocks_restored, 0);
}

TEST(KvTiersEngine, StoreHitInAFreshEngineGivesTheColdOutput) {
  TempDir dir;
  const Prompt p = long_prompt();
  EngineConfig c = tier_config();
  c.kv_tiers.store_enabled = true;
  c.kv_tiers.store_directory = dir.path();
  Completion cold;
  {
    LLM first(c);
    cold = run_one(first, p.request);
    EXPECT_EQ(cold.prompt_cache.num_cached_tokens(), 0);
  }  // the engine's store finishes its writes as it closes
  LLM second(c);  // a new engine on the same directory, as another process would be
  const Completion hit = run_one(second, p.request);
  EXPECT_EQ(hit.prompt_cache.num_store_hit_tokens, 128);
  EXPECT_EQ(hit.token_ids, cold.token_ids);
  expect_follows_reference(hit, p);
  const kv::KvCacheMetrics m = second.engine().kv_cache().metrics();
  EXPECT_EQ(m.store.num_read_hits, 4);
  EXPECT_EQ(m.num_store_hit_tokens, 128);
}

// An FP8 latent cache goes to the store as its own bytes (656 per position and layer for V3
// shapes): a fresh engine restores them and continues exactly as the cold run did, and an
// engine with the fp32 cache on the same directory finds none of them.
TEST(KvTiersEngine, Fp8CacheStoreHitGivesTheColdOutput) {
  TempDir dir;
  const Prompt p = long_prompt();
  EngineConfig c = tier_config();
  c.kv_cache_format = KvCacheFormat::kFp8;
  c.kv_tiers.store_enabled = true;
  c.kv_tiers.store_directory = dir.path();
  Completion cold;
  {
    LLM first(c);
    cold = run_one(first, p.request);
  }
  {
    LLM second(c);
    const Completion hit = run_one(second, p.request);
    EXPECT_EQ(hit.prompt_cache.num_store_hit_tokens, 128);
    EXPECT_EQ(hit.token_ids, cold.token_ids);
  }
  EngineConfig f32 = c;
  f32.kv_cache_format = KvCacheFormat::kF32;
  LLM other_format(f32);
  EXPECT_EQ(run_one(other_format, p.request).prompt_cache.num_store_hit_tokens, 0);
}

TEST(KvTiersEngine, StoreIsolatesSalts) {
  TempDir dir;
  const Prompt p = long_prompt();
  EngineConfig c = tier_config();
  c.kv_tiers.store_enabled = true;
  c.kv_tiers.store_directory = dir.path();
  GenerationRequest salted = p.request;
  salted.cache_salt = "tenant-a";
  {
    LLM first(c);
    run_one(first, salted);
  }
  LLM second(c);
  EXPECT_EQ(run_one(second, p.request).prompt_cache.num_cached_tokens(), 0);
  GenerationRequest other_tenant = p.request;
  other_tenant.cache_salt = "tenant-b";
  EXPECT_EQ(run_one(second, other_tenant).prompt_cache.num_cached_tokens(), 0);
  LLM third(c);
  EXPECT_EQ(run_one(third, salted).prompt_cache.num_store_hit_tokens, 128);
}

}  // namespace
}  // namespace dsinfer
