// EngineCore behaviour: validation, stop conditions, cancellation, prefix reuse accounting.
#include "engine/engine_core.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "test_fixtures.h"

namespace dsinfer {
namespace {

GenerationRequest greedy(std::vector<TokenId> prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  return r;
}

std::vector<RequestOutput> run_to_end(EngineCore& core, RequestId id) {
  std::vector<RequestOutput> outs;
  while (core.has_unfinished_requests())
    for (auto& o : core.step())
      if (o.request_id == id) outs.push_back(o);
  return outs;
}

TEST(EngineCore, RejectsBadRequests) {
  EngineCore core(testing::fixture_engine_config("tiny_v3"));
  EXPECT_EQ(core.add_request(1, greedy({}, 4)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(core.add_request(2, greedy({1, 512}, 4)).code(), StatusCode::kInvalidArgument);  // vocab 512
  EXPECT_EQ(core.add_request(3, greedy({1, -3}, 4)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(core.add_request(4, greedy({1, 2}, 0)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(core.add_request(5, greedy(std::vector<TokenId>(200, 5), 57)).code(), StatusCode::kOutOfRange);
  auto r = greedy({1, 2}, 4);
  r.sampling.top_p = 0.0f;
  EXPECT_EQ(core.add_request(6, r).code(), StatusCode::kInvalidArgument);
  r.sampling.top_p = 1.0f;
  r.sampling.temperature = -1.0f;
  EXPECT_EQ(core.add_request(7, r).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(core.add_request(8, greedy(std::vector<TokenId>(200, 5), 56)).ok());
  EXPECT_EQ(core.add_request(8, greedy({1}, 1)).code(), StatusCode::kInvalidArgument);  // duplicate id
  EXPECT_TRUE(core.has_unfinished_requests());
}

TEST(EngineCore, StopsOnEosUnlessIgnored) {
  // In the tiny_v3 reference the 64-token prompt's second greedy token is eos (id 1).
  const auto ref = testing::fixture_reference("tiny_v3");
  const auto& p = ref["prompts"][3];
  ASSERT_EQ(p["greedy_ids"][1].get<int>(), 1);
  EngineCore core(testing::fixture_engine_config("tiny_v3"));
  ASSERT_TRUE(core.add_request(1, greedy(p["prompt_ids"].get<std::vector<TokenId>>(), 10)).ok());
  auto outs = run_to_end(core, 1);
  ASSERT_FALSE(outs.empty());
  EXPECT_EQ(outs.back().finish_reason, FinishReason::kStop);
  EXPECT_EQ(outs.back().num_generated_tokens, 2);

  auto r = greedy(p["prompt_ids"].get<std::vector<TokenId>>(), 10);
  r.sampling.ignore_eos = true;
  ASSERT_TRUE(core.add_request(2, r).ok());
  outs = run_to_end(core, 2);
  EXPECT_EQ(outs.back().finish_reason, FinishReason::kLength);
  EXPECT_EQ(outs.back().num_generated_tokens, 10);
  int streamed = 0;
  for (auto& o : outs) streamed += o.new_token_ids.size();
  EXPECT_EQ(streamed, 10);
}

TEST(EngineCore, StopTokenIds) {
  const auto ref = testing::fixture_reference("tiny_v3");
  const auto& p = ref["prompts"][0];
  EngineCore core(testing::fixture_engine_config("tiny_v3"));
  auto r = greedy(p["prompt_ids"].get<std::vector<TokenId>>(), 20);
  r.sampling.ignore_eos = true;
  r.sampling.stop_token_ids = {p["greedy_ids"][4].get<TokenId>()};
  ASSERT_TRUE(core.add_request(1, r).ok());
  auto outs = run_to_end(core, 1);
  EXPECT_EQ(outs.back().finish_reason, FinishReason::kStop);
  EXPECT_LE(outs.back().num_generated_tokens, 5);
}

TEST(EngineCore, CancelFreesBlocksAtOnce) {
  EngineCore core(testing::fixture_engine_config("tiny_v3"));
  auto r = greedy(std::vector<TokenId>(150, 7), 50);
  ASSERT_TRUE(core.add_request(1, r).ok());
  core.step();
  EXPECT_GT(core.stats().num_kv_blocks_used, 0);
  auto out = core.abort_request(1);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(core.stats().num_kv_blocks_used, 0);
  EXPECT_FALSE(core.has_unfinished_requests());
  EXPECT_FALSE(core.abort_request(1).has_value());
}

TEST(EngineCore, PrefixHitIsAccountedAndChangesNothing) {
  const auto ref = testing::fixture_reference("tiny_v3");
  const auto prompt = ref["prompts"][5]["prompt_ids"].get<std::vector<TokenId>>();  // 130 tokens
  EngineCore core(testing::fixture_engine_config("tiny_v3"));
  auto r = greedy(prompt, 8);
  r.sampling.ignore_eos = true;
  ASSERT_TRUE(core.add_request(1, r).ok());
  auto first = run_to_end(core, 1);
  ASSERT_TRUE(core.add_request(2, r).ok());
  auto second = run_to_end(core, 2);
  EXPECT_EQ(first.back().prompt_cache.num_device_hit_tokens, 0);
  EXPECT_EQ(second.back().prompt_cache.num_device_hit_tokens, 128);  // two full 64-token blocks
  std::vector<TokenId> a, b;
  for (auto& o : first) a.insert(a.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  for (auto& o : second) b.insert(b.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  EXPECT_EQ(a, b);
  auto salted = r;
  salted.cache_salt = "tenant-b";
  ASSERT_TRUE(core.add_request(3, salted).ok());
  auto third = run_to_end(core, 3);
  EXPECT_EQ(third.back().prompt_cache.num_device_hit_tokens, 0);
}


// What a request got from the engine, all its outputs joined.
struct Outcome {
  std::vector<TokenId> tokens;
  std::vector<TokenLogprob> logprobs;
};

// A greedy request that runs to its length.
GenerationRequest greedy_request(std::vector<TokenId> prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// Runs `first` (id 1) and `second` (id 2) in the same steps until both end.
std::array<Outcome, 2> run_pair(EngineCore& core, const GenerationRequest& first, const GenerationRequest& second) {
  EXPECT_TRUE(core.add_request(1, first).ok());
  EXPECT_TRUE(core.add_request(2, second).ok());
  std::array<Outcome, 2> got;
  while (core.has_unfinished_requests())
    for (const RequestOutput& o : core.step()) {
      Outcome& outcome = got.at(o.request_id - 1);
      outcome.tokens.insert(outcome.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      outcome.logprobs.insert(outcome.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
    }
  return got;
}

// Logprobs ride along with the token choice: asking for them changes no token of a seeded
// sampled request, and each generated token carries its own log-probability and the top ones.
TEST(EngineCore, LogprobsDoNotChangeSampledTokens) {
  const auto ref = testing::fixture_reference("tiny_v3");
  const auto prompt = ref["prompts"][0]["prompt_ids"].get<std::vector<TokenId>>();
  EngineCore core(testing::fixture_engine_config("tiny_v3"));
  GenerationRequest r;
  r.prompt_ids = prompt;
  r.sampling.temperature = 1.2f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 77;
  r.sampling.max_tokens = 12;
  r.sampling.ignore_eos = true;
  GenerationRequest with_logprobs = r;
  with_logprobs.sampling.num_logprobs = 3;
  const auto [without, with] = run_pair(core, r, with_logprobs);
  const std::vector<TokenId> tokens[2] = {without.tokens, with.tokens};
  const std::vector<TokenLogprob>& logprobs = with.logprobs;
  EXPECT_TRUE(without.logprobs.empty());
  ASSERT_EQ(tokens[0].size(), 12u);
  EXPECT_EQ(tokens[1], tokens[0]);
  ASSERT_EQ(logprobs.size(), tokens[1].size());
  for (size_t i = 0; i < logprobs.size(); ++i) {
    const TokenLogprob& lp = logprobs[i];
    EXPECT_EQ(lp.token_id, tokens[1][i]);
    EXPECT_LE(lp.logprob, 0.0f);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
    EXPECT_GE(lp.top[1].second, lp.top[2].second);
    EXPECT_GE(lp.top[0].second, lp.logprob);  // the best is at least as likely as the chosen
  }
}

// logprobs without alternatives: each token's own log-probability, the same as with them.
TEST(EngineCore, LogprobsWithoutAlternativesMatchThoseWithThem) {
  const auto ref = testing::fixture_reference("tiny_v3");
  const auto prompt = ref["prompts"][0]["prompt_ids"].get<std::vector<TokenId>>();
  EngineCore core(testing::fixture_engine_config("tiny_v3"));
  GenerationRequest alone = greedy_request(prompt, 6);
  alone.sampling.logprobs = true;
  GenerationRequest with_top = alone;
  with_top.sampling.logprobs = false;
  with_top.sampling.num_logprobs = 2;
  const auto [own, top] = run_pair(core, alone, with_top);
  const std::vector<TokenLogprob> logprobs[2] = {own.logprobs, top.logprobs};
  ASSERT_EQ(logprobs[0].size(), 6u);
  ASSERT_EQ(logprobs[1].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_TRUE(logprobs[0][i].top.empty());
    EXPECT_EQ(logprobs[0][i].token_id, logprobs[1][i].token_id);
    EXPECT_FLOAT_EQ(logprobs[0][i].logprob, logprobs[1][i].logprob);
    EXPECT_LT(logprobs[0][i].logprob, 0.0f);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(logprobs[1][i].top[0].first, logprobs[1][i].token_id);
  }
}

// Presence and frequency penalties, greedy: each token is the likeliest after subtracting the
// penalties of the output so far from the model's log-probabilities (subtraction commutes with
// the softmax's shift), and the output is not the unpenalised one.
TEST(EngineCore, PresenceAndFrequencyPenaltiesFollowTheirDefinition) {
  EngineCore core(testing::fixture_engine_config("tiny_v3"));
  // A prompt of one token over and over, on which the model repeats itself.
  GenerationRequest plain = greedy_request(std::vector<TokenId>(40, 5), 24);
  plain.sampling.num_logprobs = 20;
  GenerationRequest penalised = plain;
  penalised.sampling.presence_penalty = 0.4f;
  penalised.sampling.frequency_penalty = 0.7f;
  const auto [unpenalised, got] = run_pair(core, plain, penalised);
  const std::vector<TokenId> tokens[2] = {unpenalised.tokens, got.tokens};
  const std::vector<TokenLogprob>& logprobs = got.logprobs;
  ASSERT_EQ(logprobs.size(), 24u);
  EXPECT_NE(tokens[1], tokens[0]);
  std::map<TokenId, int> counts;
  for (size_t i = 0; i < logprobs.size(); ++i) {
    float best = -1e30f;
    TokenId best_id = -1;
    for (const auto& [id, lp] : logprobs[i].top) {
      const int n = counts.count(id) ? counts[id] : 0;
      const float value = lp - (n > 0 ? 0.4f : 0.0f) - 0.7f * static_cast<float>(n);
      if (value > best || (value == best && id < best_id)) {
        best = value;
        best_id = id;
      }
    }
    // A token outside the top 20 is at most the 20th's log-probability, unpenalised.
    ASSERT_GT(best, logprobs[i].top.back().second) << "step " << i << ": inconclusive";
    EXPECT_EQ(tokens[1][i], best_id) << "step " << i;
    ++counts[tokens[1][i]];
  }
}

// logit_bias: -100 keeps a greedy request's tokens out of its output, +100 makes a token its
// every choice; a token out of the vocabulary, out of range or named twice is refused.
TEST(EngineCore, LogitBiasBansAndForcesTokens) {
  EngineCore core(testing::fixture_engine_config("tiny_v3"));
  const GenerationRequest plain = greedy_request(std::vector<TokenId>(40, 5), 12);
  const std::vector<TokenId> unbiased = run_pair(core, plain, plain)[0].tokens;
  GenerationRequest banned = plain, forced = plain;
  for (TokenId t : unbiased)
    if (std::find_if(banned.sampling.logit_bias.begin(), banned.sampling.logit_bias.end(),
                     [t](const auto& b) { return b.first == t; }) == banned.sampling.logit_bias.end())
      banned.sampling.logit_bias.emplace_back(t, -100.0f);
  forced.sampling.logit_bias = {{123, 100.0f}};
  const auto [without, with] = run_pair(core, banned, forced);
  ASSERT_EQ(without.tokens.size(), 12u);
  for (TokenId t : without.tokens) EXPECT_EQ(std::count(unbiased.begin(), unbiased.end(), t), 0) << t;
  EXPECT_EQ(with.tokens, std::vector<TokenId>(12, 123));
  for (auto bias : {std::vector<std::pair<TokenId, float>>{{512, 1.0f}}, {{3, 101.0f}}, {{3, 1.0f}, {3, 2.0f}}}) {
    GenerationRequest bad = plain;
    bad.sampling.logit_bias = bias;
    EXPECT_EQ(core.add_request(9, bad).code(), StatusCode::kInvalidArgument);
  }
}

// The repetition penalty divides a seen token's positive logit and multiplies a negative one,
// prompt tokens included; the others are untouched.
TEST(CpuBackend, PenaliseLogitsChangesOnlyTheNamedOnes) {
  CpuBackend cpu;
  Tensor logits = cpu.empty({2, 4}, DType::kF32);
  const float values[8] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 4.0f, 1.0f, 0.0f};
  std::copy(values, values + 8, logits.as<float>());
  const LogitPenalty penalties[] = {{0, 0, 2.0f, 0.0f}, {0, 1, 2.0f, 0.5f}, {1, 1, 1.0f, 1.5f}, {1, 3, 1.25f, 0.0f}};
  cpu.penalise_logits(logits, penalties);
  const float* got = logits.as<float>();
  const float want[8] = {1.0f, -2.5f, 0.5f, 3.0f, -2.0f, 2.5f, 1.0f, 0.0f};
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << i;
}

}  // namespace
}  // namespace dsinfer
