// The engine under pressure, against each request alone: requests that share prompt prefixes
// (device prefix hits), prompts longer than a step's token budget (prefill in chunks over the
// part already cached), more requests than the KV blocks hold (preempted, then computed again),
// one step scheduled ahead, KV blocks evicted to a host tier and found in a block store by a
// fresh engine. A backend whose outputs do not depend on the batch (the CPU backend; the CUDA
// backend in its batch-invariant mode) must give every request the tokens it gives alone in a
// roomy engine: greedy, seeded sampling, penalties and stop tokens alike. unit_engine runs it
// on the CPU backend, unit_cuda on the CUDA backend.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "dsinfer/llm.h"
#include "engine/engine_config.h"
#include "engine/engine_core.h"
#include "temp_dir.h"

namespace dsinfer::test_support {

// Requests over five shared prefixes whose lengths fall on, inside and across 64-token blocks,
// each with a suffix of its own (1 to 60 tokens) and 6 to 28 new tokens, 238 positions at most
// (tiny_v3 holds 256); every fourth one samples with its own seed, the rest are greedy; every
// fifth has presence, frequency and repetition penalties and a logit bias. Token ids below
// `vocab`.
inline std::vector<GenerationRequest> pressure_requests(int count, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> token(2, vocab - 1), suffix_len(1, 60);
  auto random_ids = [&](int n) {
    std::vector<TokenId> ids(n);
    for (TokenId& t : ids) t = token(rng);
    return ids;
  };
  const int prefix_lens[] = {40, 64, 100, 128, 150};
  std::vector<std::vector<TokenId>> prefixes;
  for (int len : prefix_lens) prefixes.push_back(random_ids(len));
  std::vector<GenerationRequest> out(count);
  for (int i = 0; i < count; ++i) {
    GenerationRequest& r = out[i];
    r.prompt_ids = prefixes[i % prefixes.size()];
    const std::vector<TokenId> suffix = random_ids(suffix_len(rng));
    r.prompt_ids.insert(r.prompt_ids.end(), suffix.begin(), suffix.end());
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = 6 + i % 23;
    if (i % 4 == 3) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = 100 + i;
    } else {
      r.sampling.temperature = 0.0f;
    }
    if (i % 5 == 2) {  // penalties over the output (and prompt) seen so far, and a bias
      r.sampling.presence_penalty = 0.5f;
      r.sampling.frequency_penalty = 0.3f;
      r.sampling.repetition_penalty = 1.2f;
      r.sampling.logit_bias = {{r.prompt_ids.back(), 2.0f}, {r.prompt_ids.front(), -100.0f}};
    }
  }
  return out;
}

// `roomy` under pressure: 16 KV blocks (four to eight of the requests at once), steps of at most
// 96 tokens, one step scheduled ahead, a host tier for evicted blocks and a block store in
// `store_directory`.
inline EngineConfig pressure_config(EngineConfig roomy, const std::string& store_directory) {
  EngineConfig c = std::move(roomy);
  c.num_kv_blocks = 16;
  c.max_num_batched_tokens = 96;
  c.async_scheduling = true;
  c.enable_prefix_caching = true;
  c.kv_tiers.host_cache_bytes = 64 << 20;
  c.kv_tiers.store_enabled = true;
  c.kv_tiers.store_directory = store_directory;
  return c;
}

// Every completion of `got` succeeded with the tokens of the same request's in `want`.
inline void expect_same_tokens(const std::vector<Completion>& got, const std::vector<Completion>& want,
                               const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << what << ", request " << i << ": " << got[i].status.to_string();
    EXPECT_EQ(got[i].token_ids, want[i].token_ids) << what << ", request " << i;
  }
}

// Runs `count` pressure requests alone in `roomy` (prefix caching off: each one cold), then
// together twice in one pressured engine and once more in a fresh pressured engine on the same
// block store, and expects every request's tokens to be its tokens alone each time (every sixth
// then stopping at a token it gave alone). Also expects the pressure to have done what it is
// for: preemptions, blocks evicted to the host tier, and device, host and store hits (prompts of
// more than 96 tokens go in chunks by construction).
inline void expect_pressure_gives_tokens_alone(EngineConfig roomy, int vocab, int count = 40) {
  const std::vector<GenerationRequest> requests = pressure_requests(count, vocab, 2024);
  std::vector<Completion> alone;
  {
    EngineConfig cold = roomy;
    cold.enable_prefix_caching = false;
    LLM llm(cold);
    for (const GenerationRequest& r : requests) {
      std::vector<Completion> one = llm.generate({r});
      ASSERT_EQ(one.size(), 1u);
      ASSERT_TRUE(one[0].status.ok()) << one[0].status.to_string();
      ASSERT_EQ(one[0].token_ids.size(), static_cast<size_t>(r.sampling.max_tokens));
      alone.push_back(std::move(one[0]));
    }
  }
  int num_distinct = 0;
  for (const Completion& c : alone) num_distinct += c.token_ids != alone[0].token_ids;
  EXPECT_GE(num_distinct, count / 2) << "the requests should not all produce the same tokens";
  // Every sixth request stops at the token it gave alone halfway (or earlier, where that token
  // came before): under pressure it ends while the step after it is already launched, and its
  // blocks go back while that step runs.
  std::vector<GenerationRequest> together = requests;
  int num_stopping = 0;
  for (size_t i = 1; i < together.size(); i += 6) {
    const std::vector<TokenId>& ids = alone[i].token_ids;
    const TokenId stop = ids[ids.size() / 2];
    together[i].sampling.stop_token_ids = {stop};
    alone[i].token_ids.resize(std::find(ids.begin(), ids.end(), stop) - ids.begin() + 1);
    num_stopping += alone[i].token_ids.size() < static_cast<size_t>(requests[i].sampling.max_tokens);
  }
  EXPECT_GT(num_stopping, 0);

  TempDir store;
  const EngineConfig pressed = pressure_config(roomy, store.path());
  {
    LLM llm(pressed);
    expect_same_tokens(llm.generate(together), alone, "first run under pressure");
    const EngineStats first = llm.engine().stats();
    EXPECT_GT(first.num_preemptions, 0) << "16 blocks should not hold every request at once";
    const std::vector<Completion> again = llm.generate(together);
    expect_same_tokens(again, alone, "second run under pressure");
    int64_t device_hits = 0;
    for (const Completion& c : again) device_hits += c.prompt_cache.num_device_hit_tokens;
    EXPECT_GT(device_hits, 0);
    const kv::KvCacheMetrics m = llm.engine().kv_cache().metrics();
    EXPECT_GT(m.num_blocks_offloaded, 0);
    EXPECT_GT(m.num_host_hit_tokens, 0);
    std::cout << "under pressure: " << first.num_preemptions << " preemptions in the first run; "
              << m.num_blocks_offloaded << " blocks evicted to the host tier; prompt tokens found on the device "
              << m.num_device_hit_tokens << ", on the host " << m.num_host_hit_tokens << "\n";
  }  // the store finishes its writes as the engine closes
  LLM fresh(pressed);  // another engine on the same store, as another process would be
  const std::vector<Completion> from_store = fresh.generate(together);
  expect_same_tokens(from_store, alone, "a fresh engine on the block store");
  int64_t store_hits = 0;
  for (const Completion& c : from_store) store_hits += c.prompt_cache.num_store_hit_tokens;
  EXPECT_GT(store_hits, 0);
  std::cout << "a fresh engine found " << store_hits << " prompt tokens in the block store\n";
}

}  // namespace dsinfer::test_support
