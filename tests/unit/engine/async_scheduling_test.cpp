// Asynchronous scheduling (EngineConfig::async_scheduling): step N+1 is scheduled and launched
// before step N's tokens are back, its inputs naming N's choice by row. Whatever the mix of
// requests, every request must end with the tokens and finish reason it gets without it.
#include <gtest/gtest.h>

#include <map>

#include "engine/engine_core.h"
#include "test_fixtures.h"

namespace dsinfer {
namespace {

struct Result {
  std::vector<TokenId> tokens;
  FinishReason finish = FinishReason::kNone;
  int num_logprobs = 0;
};

GenerationRequest make(std::vector<TokenId> prompt, int max_tokens, float temperature, uint64_t seed) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  return r;
}

// The requests of the comparison: greedy ones that stop on eos and on a stop token, seeded
// sampled ones (top-p, top-k), one with logprobs, prompts longer than the step's token budget
// (chunked prefill), one that ignores eos and runs to its length, one with penalties.
std::vector<GenerationRequest> request_mix() {
  const auto ref = testing::fixture_reference("tiny_v3");
  std::vector<GenerationRequest> mix;
  for (size_t p = 0; p < ref["prompts"].size(); ++p) {
    const auto prompt = ref["prompts"][p]["prompt_ids"].get<std::vector<TokenId>>();
    mix.push_back(make(prompt, 10, 0.0f, 0));  // greedy; prompt 3 stops on eos at its 2nd token
    auto sampled = make(prompt, 9, 1.1f, 100 + p);
    sampled.sampling.top_p = 0.9f;
    sampled.sampling.ignore_eos = p % 2 == 0;
    mix.push_back(sampled);
  }
  auto stop_token = make(ref["prompts"][0]["prompt_ids"].get<std::vector<TokenId>>(), 20, 0.0f, 0);
  stop_token.sampling.ignore_eos = true;
  stop_token.sampling.stop_token_ids = {ref["prompts"][0]["greedy_ids"][4].get<TokenId>()};
  mix.push_back(stop_token);
  auto logprobs = make(std::vector<TokenId>(90, 11), 7, 0.8f, 7);
  logprobs.sampling.top_k = 20;
  logprobs.sampling.num_logprobs = 2;
  mix.push_back(logprobs);
  auto to_length = make(std::vector<TokenId>(40, 5), 25, 0.0f, 0);
  to_length.sampling.ignore_eos = true;
  mix.push_back(to_length);
  // Penalties read every token before the one being chosen: such a request holds the engine to
  // one step at a time, and must end as it does without asynchronous scheduling.
  auto penalised = make(std::vector<TokenId>(40, 5), 25, 0.0f, 0);  // as to_length, which repeats itself
  penalised.sampling.ignore_eos = true;
  penalised.sampling.frequency_penalty = 1.5f;
  penalised.sampling.presence_penalty = 0.5f;
  penalised.sampling.repetition_penalty = 1.3f;
  mix.push_back(penalised);
  return mix;
}

// Runs the mix: the first half at once, the rest while the engine is busy (one every other
// step), so that requests join while a step is in flight.
std::map<RequestId, Result> run(bool async, int num_kv_blocks, int64_t* num_preemptions = nullptr) {
  EngineConfig config = testing::fixture_engine_config("tiny_v3");
  config.async_scheduling = async;
  config.max_num_batched_tokens = 48;
  if (num_kv_blocks > 0) {  // small enough that requests are preempted
    config.num_kv_blocks = num_kv_blocks;
    config.block_size_tokens = 16;
    config.max_model_len = 256;
  }
  EngineCore core(config);
  const auto mix = request_mix();
  std::map<RequestId, Result> results;
  size_t next = 0;
  for (; next < mix.size() / 2; ++next) EXPECT_TRUE(core.add_request(next, mix[next]).ok());
  for (int step = 0; core.has_unfinished_requests() || next < mix.size(); ++step) {
    if (next < mix.size() && step % 2 == 1) {
      EXPECT_TRUE(core.add_request(next, mix[next]).ok());
      ++next;
    }
    for (const RequestOutput& o : core.step()) {
      Result& r = results[o.request_id];
      r.tokens.insert(r.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      r.num_logprobs += static_cast<int>(o.logprobs.size());
      EXPECT_EQ(r.finish, FinishReason::kNone) << "request " << o.request_id << " has output after finishing";
      r.finish = o.finish_reason;
      EXPECT_EQ(o.num_generated_tokens, static_cast<int>(r.tokens.size()));
    }
    EXPECT_LT(step, 2000) << "the engine does not finish";
    if (step >= 2000) break;
  }
  EXPECT_EQ(core.stats().num_kv_blocks_used, 0);
  if (num_preemptions != nullptr) *num_preemptions = core.stats().num_preemptions;
  return results;
}

void expect_same(const std::map<RequestId, Result>& async, const std::map<RequestId, Result>& sync) {
  ASSERT_EQ(async.size(), sync.size());
  int stopped = 0;
  for (const auto& [id, want] : sync) {
    const Result& got = async.at(id);
    EXPECT_EQ(got.tokens, want.tokens) << "request " << id;
    EXPECT_EQ(got.finish, want.finish) << "request " << id;
    EXPECT_EQ(got.num_logprobs, want.num_logprobs) << "request " << id;
    stopped += want.finish == FinishReason::kStop;
  }
  EXPECT_GT(stopped, 1);  // eos and the stop token were hit: the one-step lag was exercised
}

TEST(AsyncScheduling, SameTokensAndFinishReasonsAsWithout) {
  const auto sync = run(false, 0);
  const auto async = run(true, 0);
  expect_same(async, sync);
}

TEST(AsyncScheduling, SameTokensWhenRequestsArePreempted) {
  int64_t preemptions = 0;
  const auto sync = run(false, 16, &preemptions);
  ASSERT_GT(preemptions, 0) << "the KV cache should be small enough to preempt";
  const auto async = run(true, 16, &preemptions);
  EXPECT_GT(preemptions, 0);
  expect_same(async, sync);
}

// One step ahead only while every request decodes: a step with prompt tokens is finished in the
// call that launches it (its first tokens come back at once), and the decode step in flight
// when a prompt arrives is finished, its tokens returned, before the prompt's step is launched.
TEST(AsyncScheduling, StepsWithPromptTokensAreNotLaunchedAhead) {
  EngineConfig config = testing::fixture_engine_config("tiny_v3");
  config.async_scheduling = true;
  EngineCore core(config);
  auto r = make(std::vector<TokenId>(20, 7), 8, 0.0f, 0);
  r.sampling.ignore_eos = true;
  auto tokens_of = [](const std::vector<RequestOutput>& outs, RequestId id) {
    int n = 0;
    for (const RequestOutput& o : outs)
      if (o.request_id == id) n += static_cast<int>(o.new_token_ids.size());
    return n;
  };
  ASSERT_TRUE(core.add_request(1, r).ok());
  auto outs = core.step();  // request 1's prefill, finished in this call
  EXPECT_EQ(core.stats().num_steps, 1);
  EXPECT_EQ(tokens_of(outs, 1), 1);
  outs = core.step();  // its first decode step, launched ahead
  EXPECT_EQ(core.stats().num_steps, 2);
  EXPECT_TRUE(outs.empty());
  outs = core.step();  // the next one launched, the first one finished
  EXPECT_EQ(core.stats().num_steps, 3);
  EXPECT_EQ(tokens_of(outs, 1), 1);
  ASSERT_TRUE(core.add_request(2, r).ok());
  outs = core.step();  // the step in flight finished; nothing launched before its tokens are out
  EXPECT_EQ(core.stats().num_steps, 3);
  EXPECT_EQ(tokens_of(outs, 1), 1);
  outs = core.step();  // request 2's prefill with request 1's decode, finished in this call
  EXPECT_EQ(core.stats().num_steps, 4);
  EXPECT_EQ(tokens_of(outs, 1), 1);
  EXPECT_EQ(tokens_of(outs, 2), 1);
  outs = core.step();  // both decode: one step ahead again
  EXPECT_EQ(core.stats().num_steps, 5);
  EXPECT_TRUE(outs.empty());
  int total[3] = {0, 4, 1};
  while (core.has_unfinished_requests()) {
    outs = core.step();
    total[1] += tokens_of(outs, 1);
    total[2] += tokens_of(outs, 2);
  }
  EXPECT_EQ(total[1], 8);
  EXPECT_EQ(total[2], 8);
  EXPECT_EQ(core.stats().num_kv_blocks_used, 0);
}

// A request that waits for a running request's place (max_num_seqs) is no prefill work yet:
// the decode steps before it is admitted still go one ahead.
TEST(AsyncScheduling, ARequestWaitingForAPlaceLeavesDecodeStepsAhead) {
  EngineConfig config = testing::fixture_engine_config("tiny_v3");
  config.async_scheduling = true;
  config.max_num_seqs = 1;
  EngineCore core(config);
  auto r = make(std::vector<TokenId>(20, 7), 4, 0.0f, 0);
  r.sampling.ignore_eos = true;
  ASSERT_TRUE(core.add_request(1, r).ok());
  EXPECT_EQ(core.step().size(), 1u);  // request 1's prefill, its first token back at once
  ASSERT_TRUE(core.add_request(2, r).ok());
  EXPECT_TRUE(core.step().empty());  // request 1's decode, launched ahead though 2 waits
  EXPECT_EQ(core.stats().num_steps, 2);
  EXPECT_EQ(core.stats().num_waiting, 1);
  int tokens[3] = {0, 1, 0};
  while (core.has_unfinished_requests())
    for (const RequestOutput& o : core.step()) tokens[o.request_id] += static_cast<int>(o.new_token_ids.size());
  EXPECT_EQ(tokens[1], 4);
  EXPECT_EQ(tokens[2], 4);
}

// A request cancelled while a step that includes it is in flight: its output says so, the
// step's row for it is dropped, its blocks are freed, and the other request is unaffected.
TEST(AsyncScheduling, CancelWhileAStepIsInFlight) {
  const auto ref = testing::fixture_reference("tiny_v3");
  const auto prompt = ref["prompts"][1]["prompt_ids"].get<std::vector<TokenId>>();
  std::vector<TokenId> tokens[2];
  for (bool async : {false, true}) {
    EngineConfig config = testing::fixture_engine_config("tiny_v3");
    config.async_scheduling = async;
    EngineCore core(config);
    auto r = make(prompt, 12, 0.0f, 0);
    r.sampling.ignore_eos = true;
    ASSERT_TRUE(core.add_request(1, r).ok());
    ASSERT_TRUE(core.add_request(2, r).ok());
    std::vector<TokenId>& got = tokens[async];
    for (int step = 0; step < 4; ++step)
      for (const RequestOutput& o : core.step())
        if (o.request_id == 1) got.insert(got.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    auto cancelled = core.abort_request(2);
    ASSERT_TRUE(cancelled.has_value());
    EXPECT_EQ(cancelled->finish_reason, FinishReason::kCancelled);
    while (core.has_unfinished_requests())
      for (const RequestOutput& o : core.step()) {
        EXPECT_NE(o.request_id, 2u) << "output for a cancelled request";
        if (o.request_id == 1) got.insert(got.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      }
    EXPECT_EQ(core.stats().num_kv_blocks_used, 0);
  }
  EXPECT_EQ(tokens[1], tokens[0]);
  EXPECT_EQ(tokens[0].size(), 12u);
}

}  // namespace
}  // namespace dsinfer
