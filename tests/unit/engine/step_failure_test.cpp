// A step whose launch fails (the device out of memory for its activations) runs again in
// smaller steps where it can be split; otherwise it ends, with the error, the requests that
// brought prompt tokens to it (all of its requests where none did), and only those: the rest
// finish with the tokens they get without the failure, and every block returns to the pool. A failure outside a launch (a bug) ends the
// asynchronous engine: its running requests get the error, new ones are refused.
// The failures are made by DSINFER_INJECT_FAULTS (core/fault_injection.h).
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/fault_injection.h"
#include "engine/async_engine.h"
#include "engine/engine_core.h"
#include "engine_outputs.h"
#include "scoped_faults.h"
#include "test_fixtures.h"

namespace dsinfer {
namespace {

using testing::ScopedFaults;

GenerationRequest greedy(const std::vector<TokenId>& prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt_ids = prompt;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

std::vector<GenerationRequest> two_requests() {
  const auto ref = testing::fixture_reference("tiny_v3");
  return {greedy(ref["prompts"][0]["prompt_ids"].get<std::vector<TokenId>>(), 6),
          greedy(ref["prompts"][1]["prompt_ids"].get<std::vector<TokenId>>(), 6)};
}

EngineConfig one_at_a_time(bool async) {
  EngineConfig config = testing::fixture_engine_config("tiny_v3");
  config.async_scheduling = async;
  config.max_num_seqs = 1;  // the second request waits: it is in no step with the first
  return config;
}

class StepFailure : public ::testing::TestWithParam<bool> {};

TEST_P(StepFailure, AFailedLaunchEndsOnlyTheRequestsOfItsStep) {
  const auto requests = two_requests();
  testing::Outputs expected;
  int64_t blocks_used_after = 0;
  {
    EngineCore core(one_at_a_time(GetParam()));
    for (RequestId id = 0; id < 2; ++id) ASSERT_TRUE(core.add_request(id, requests[id]).ok());
    expected = testing::run_to_end(core);
    blocks_used_after = core.stats().num_kv_blocks_used;
  }
  ASSERT_EQ(expected[0].tokens.size(), 6u);
  ASSERT_EQ(expected[1].tokens.size(), 6u);

  EngineCore core(one_at_a_time(GetParam()));
  for (RequestId id = 0; id < 2; ++id) ASSERT_TRUE(core.add_request(id, requests[id]).ok());
  ScopedFaults faults("forward:3");  // request 0's prefill, its first decode step, then this
  const auto results = testing::run_to_end(core);

  const testing::FinishedRequest& failed = results.at(0);
  EXPECT_EQ(failed.finish, FinishReason::kError);
  EXPECT_EQ(failed.error.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(failed.error.message().find("injected fault at forward"), std::string::npos) << failed.error.message();
  ASSERT_LT(failed.tokens.size(), 6u);
  EXPECT_TRUE(std::equal(failed.tokens.begin(), failed.tokens.end(), expected[0].tokens.begin()))
      << "the tokens before the failure are the ones it would have had";

  const testing::FinishedRequest& other = results.at(1);
  EXPECT_EQ(other.finish, FinishReason::kLength);
  EXPECT_EQ(other.tokens, expected[1].tokens);
  EXPECT_TRUE(other.error.ok());

  EXPECT_EQ(core.stats().num_failed_steps, 1);
  EXPECT_EQ(core.stats().num_kv_blocks_used, blocks_used_after) << "the failed request's blocks returned";
}

// Two prompts of 1 and 5 tokens share a step that fails: too small to split into smaller steps,
// so both end with the error, and a later request runs.
TEST_P(StepFailure, PromptsOfAStepTooSmallToSplitEndAndLaterOnesRun) {
  const auto requests = two_requests();
  std::vector<TokenId> expected;
  {
    EngineCore core(one_at_a_time(GetParam()));
    ASSERT_TRUE(core.add_request(7, requests[1]).ok());
    expected = testing::run_to_end(core).at(7).tokens;
  }
  EngineConfig config = testing::fixture_engine_config("tiny_v3");
  config.async_scheduling = GetParam();
  EngineCore core(config);
  for (RequestId id = 0; id < 2; ++id) ASSERT_TRUE(core.add_request(id, requests[id]).ok());
  ScopedFaults faults("forward:1");  // the step that holds both prefills
  auto results = testing::run_to_end(core);
  EXPECT_EQ(results.at(0).finish, FinishReason::kError);
  EXPECT_EQ(results.at(1).finish, FinishReason::kError);
  EXPECT_TRUE(results.at(0).tokens.empty());
  EXPECT_EQ(core.stats().num_kv_blocks_used, 0);

  ASSERT_TRUE(core.add_request(7, requests[1]).ok());
  results = testing::run_to_end(core);
  EXPECT_EQ(results.at(7).finish, FinishReason::kLength);
  EXPECT_EQ(results.at(7).tokens, expected);
}

// Prompts of 65 and 130 tokens share a step that runs out of memory: steps then take at most
// half its tokens, and both run again, in chunks, to the tokens an engine with that budget
// gives them. Where the smaller step fails too (48 tokens would be below the floor of 64), they
// end with the error.
TEST_P(StepFailure, AStepOutOfMemoryRunsAgainInSmallerSteps) {
  const auto ref = testing::fixture_reference("tiny_v3");
  const std::vector<GenerationRequest> requests = {
      greedy(ref["prompts"][4]["prompt_ids"].get<std::vector<TokenId>>(), 6),
      greedy(ref["prompts"][5]["prompt_ids"].get<std::vector<TokenId>>(), 6)};
  EngineConfig config = testing::fixture_engine_config("tiny_v3");
  config.async_scheduling = GetParam();
  testing::Outputs results;
  int budget_after = 0;
  {
    EngineCore core(config);
    for (RequestId id = 0; id < 2; ++id) ASSERT_TRUE(core.add_request(id, requests[id]).ok());
    ScopedFaults faults("forward:1");
    testing::run_to_end(core, results);
    EXPECT_EQ(core.stats().num_failed_steps, 1);
    budget_after = core.stats().step_token_budget;
  }
  EXPECT_EQ(budget_after, (65 + 130) / 2);
  config.max_num_batched_tokens = budget_after;
  EngineCore with_that_budget(config);
  for (RequestId id = 0; id < 2; ++id) ASSERT_TRUE(with_that_budget.add_request(id, requests[id]).ok());
  const auto expected = testing::run_to_end(with_that_budget);
  for (RequestId id = 0; id < 2; ++id) {
    EXPECT_EQ(results.at(id).finish, FinishReason::kLength) << id;
    EXPECT_EQ(results.at(id).tokens, expected.at(id).tokens) << id;
  }

  config.max_num_batched_tokens = 2048;
  EngineCore core(config);
  for (RequestId id = 0; id < 2; ++id) ASSERT_TRUE(core.add_request(id, requests[id]).ok());
  ScopedFaults faults("forward:1,forward:2");
  const auto failed = testing::run_to_end(core);
  for (RequestId id = 0; id < 2; ++id) {
    EXPECT_EQ(failed.at(id).finish, FinishReason::kError) << id;
    EXPECT_EQ(failed.at(id).error.code(), StatusCode::kResourceExhausted) << id;
  }
  EXPECT_EQ(core.stats().num_failed_steps, 2);
  EXPECT_EQ(core.stats().step_token_budget, 97);
  EXPECT_EQ(core.stats().num_kv_blocks_used, 0);
}

// A request decoding when another's prompt joins it in a step that fails: the newcomer ends
// with the error, the decoding one runs on and gets every token it gets alone.
TEST_P(StepFailure, ARequestDecodingBesideAFailedPromptRunsOn) {
  const auto requests = two_requests();
  GenerationRequest decoding = requests[0];
  decoding.sampling.max_tokens = 12;
  std::vector<TokenId> expected;
  {
    EngineCore core(one_at_a_time(GetParam()));
    ASSERT_TRUE(core.add_request(0, decoding).ok());
    expected = testing::run_to_end(core).at(0).tokens;
  }
  ASSERT_EQ(expected.size(), 12u);
  EngineConfig config = testing::fixture_engine_config("tiny_v3");
  config.async_scheduling = GetParam();
  EngineCore core(config);
  ASSERT_TRUE(core.add_request(0, decoding).ok());
  testing::Outputs results;
  for (int i = 0; i < 4; ++i) testing::add_outputs(results, core.step());  // its prompt, decode steps
  ASSERT_TRUE(core.add_request(1, requests[1]).ok());
  {
    ScopedFaults faults("forward:1");  // the first step after this holds the newcomer's prompt
    for (int i = 0; i < 3; ++i) testing::add_outputs(results, core.step());
  }
  testing::run_to_end(core, results);
  EXPECT_EQ(results.at(1).finish, FinishReason::kError);
  EXPECT_TRUE(results.at(1).tokens.empty());
  EXPECT_EQ(results.at(0).finish, FinishReason::kLength);
  EXPECT_EQ(results.at(0).tokens, expected);
  EXPECT_EQ(core.stats().num_failed_steps, 1);
  EXPECT_EQ(core.stats().num_kv_blocks_used, 0) << "every block returned";
}

INSTANTIATE_TEST_SUITE_P(Scheduling, StepFailure, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Async" : "Sync"; });

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  RequestOutput last;
  bool finished = false;
  EngineClient::OutputCallback callback() {
    return [this](const RequestOutput& o) {
      std::lock_guard<std::mutex> lock(mu);
      last = o;
      finished = o.finished();
      cv.notify_all();
    };
  }
  bool wait_finished() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return finished; });
  }
};

TEST(EngineFailure, AFailureOutsideALaunchEndsTheEngineWithAClearError) {
  AsyncEngine engine(testing::fixture_engine_config("tiny_v3"));
  EXPECT_TRUE(engine.health().ok());
  ScopedFaults faults("engine_step:3");
  Collector running;
  ASSERT_TRUE(engine.submit(two_requests()[0], running.callback()).ok());
  ASSERT_TRUE(running.wait_finished());
  EXPECT_EQ(running.last.finish_reason, FinishReason::kError);
  EXPECT_EQ(running.last.error.code(), StatusCode::kUnavailable);
  EXPECT_NE(running.last.error.message().find("the engine failed"), std::string::npos);

  EXPECT_EQ(engine.health().code(), StatusCode::kUnavailable);
  Collector refused;
  auto again = engine.submit(two_requests()[1], refused.callback());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(engine.num_unfinished(), 0);
  engine.shutdown();  // joins the ended engine thread
}

}  // namespace
}  // namespace dsinfer
