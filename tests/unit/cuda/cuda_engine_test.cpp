// The engine on the CUDA backend: a request's greedy tokens are the same alone or among 63
// others (batch-invariant mode, and the fp32 precision mode), decode steps replayed from
// recordings give the tokens that eager steps give, the shared experts beside or after the
// routed ones give the same tokens, and scheduling one step ahead (token choices kept on the
// device) gives the tokens of scheduling after each step.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>

#include "backend/backend.h"
#include "cuda_test_util.h"
#include "dsinfer/llm.h"
#include "engine/engine_config.h"

namespace dsinfer {
namespace {

using testing_cuda::ScopedEnv;

EngineConfig cuda_config() { return testing_cuda::tiny_v3_cuda_config(); }

std::vector<GenerationRequest> random_requests(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> token(2, 511), len(1, 120), steps(4, 24);
  std::vector<GenerationRequest> out(count);
  for (auto& r : out) {
    r.prompt_ids.resize(len(rng));
    for (auto& t : r.prompt_ids) t = token(rng);
    r.sampling.temperature = 0.0f;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = steps(rng);
  }
  return out;
}

class CudaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

// Four requests' greedy tokens alone and among 63 others, in a mode that the environment
// variable `name` = `value` turns on.
void expect_alone_as_in_batch_of_64(const char* name, const char* value) {
  ScopedEnv mode(name, value);
  auto requests = random_requests(64, 7);
  for (auto& r : requests) r.sampling.max_tokens = 24;
  std::vector<Completion> together;
  {
    LLM llm(cuda_config());
    together = llm.generate(requests);
  }
  LLM alone_llm(cuda_config());
  int num_distinct = 0;
  for (int i : {0, 17, 42, 63}) {
    const auto alone = alone_llm.generate({requests[i]});
    ASSERT_TRUE(alone[0].status.ok() && together[i].status.ok());
    ASSERT_EQ(alone[0].token_ids.size(), 24u);
    EXPECT_EQ(alone[0].token_ids, together[i].token_ids) << "request " << i;
    num_distinct += together[i].token_ids != together[0].token_ids;
  }
  EXPECT_GE(num_distinct, 2) << "the requests should not all produce the same tokens";
}

TEST_F(CudaEngineTest, GreedyTokensAloneAndInBatchOf64Match) {
  expect_alone_as_in_batch_of_64("DSINFER_BATCH_INVARIANT", "1");
}

// The fp32 precision mode takes the batch-invariant forms too.
TEST_F(CudaEngineTest, Fp32PrecisionModeGivesTheSameTokensAloneAndInBatchOf64) {
  expect_alone_as_in_batch_of_64("DSINFER_CUDA_PRECISION", "fp32");
}

TEST_F(CudaEngineTest, RecordedDecodeStepsMatchEagerSteps) {
  ScopedEnv invariant("DSINFER_BATCH_INVARIANT", "1");
  const auto requests = random_requests(11, 9);
  std::vector<Completion> eager, recorded;
  {
    ScopedEnv no_graphs("DSINFER_CUDA_GRAPHS", "0");
    LLM llm(cuda_config());
    eager = llm.generate(requests);
  }
  {
    LLM llm(cuda_config());
    // A bucket runs eagerly twice before it is recorded: by the third run every bucket of the
    // first has been recorded and replays.
    for (int run = 0; run < 3; ++run) recorded = llm.generate(requests);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(recorded[i].status.ok());
    EXPECT_EQ(recorded[i].token_ids, eager[i].token_ids) << "request " << i;
    EXPECT_EQ(recorded[i].token_ids.size(), static_cast<size_t>(requests[i].sampling.max_tokens));
  }
}

// Decode steps of 33 to 128 rows run the shared experts' cuBLASLt products on the side stream,
// beside the routed experts (DSINFER_MOE_SHARED_BESIDE_LIBRARY=0: after them, on the main
// stream). Eager, and recorded into graphs and replayed, both give the same tokens, in the
// default (not batch-invariant) mode.
TEST_F(CudaEngineTest, SharedExpertsBesideTheRoutedOnesGiveTheSameTokensEagerAndRecorded) {
  auto requests = random_requests(48, 13);
  for (auto& r : requests) r.sampling.max_tokens = 24;
  constexpr int kRuns = 3;  // the third replays recordings (see RecordedDecodeStepsMatchEagerSteps)
  std::vector<Completion> beside[kRuns], after[kRuns];
  {
    LLM llm(cuda_config());
    for (int run = 0; run < kRuns; ++run) beside[run] = llm.generate(requests);
  }
  {
    ScopedEnv serial("DSINFER_MOE_SHARED_BESIDE_LIBRARY", "0");
    LLM llm(cuda_config());
    for (int run = 0; run < kRuns; ++run) after[run] = llm.generate(requests);
  }
  for (int run = 0; run < kRuns; ++run) {
    int num_distinct = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(beside[run][i].status.ok() && after[run][i].status.ok());
      ASSERT_EQ(beside[run][i].token_ids.size(), 24u);
      EXPECT_EQ(beside[run][i].token_ids, after[run][i].token_ids) << "run " << run << ", request " << i;
      num_distinct += beside[run][i].token_ids != beside[run][0].token_ids;
    }
    EXPECT_GE(num_distinct, 2) << "the requests should not all produce the same tokens";
  }
}

// A sequence whose context grows past DSINFER_MLA_LONG_CONTEXT_TILES positions moves its
// attention from the split kernel to the few-token head tiles: its decode steps are then recorded
// apart (Backend::recording_variant), and replays of either form give the tokens of eager steps.
TEST_F(CudaEngineTest, RecordedStepsAcrossTheLongContextFormGiveTheEagerTokens) {
  ScopedEnv long_context("DSINFER_MLA_LONG_CONTEXT_TILES", "64");
  auto requests = random_requests(3, 21);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].prompt_ids.resize(30 + 10 * i, 7 + static_cast<TokenId>(i));
    requests[i].sampling.max_tokens = 60;
  }
  for (const GenerationRequest& r : requests) {
    Completion eager, recorded;
    {
      ScopedEnv no_graphs("DSINFER_CUDA_GRAPHS", "0");
      LLM llm(cuda_config());
      eager = llm.generate({r})[0];
    }
    {
      LLM llm(cuda_config());
      recorded = llm.generate({r})[0];  // each form's third step and those after it replay
    }
    ASSERT_TRUE(eager.status.ok() && recorded.status.ok());
    ASSERT_EQ(recorded.token_ids.size(), 60u);
    EXPECT_EQ(recorded.token_ids, eager.token_ids) << "prompt of " << r.prompt_ids.size() << " tokens";
  }
}

TEST_F(CudaEngineTest, SchedulingOneStepAheadGivesTheSameTokens) {
  ScopedEnv invariant("DSINFER_BATCH_INVARIANT", "1");
  auto requests = random_requests(24, 11);
  for (size_t i = 0; i < requests.size(); ++i) {
    SamplingParams& s = requests[i].sampling;
    if (i % 3 == 1) {  // seeded sampling: the device choice draws from the request's stream
      s.temperature = 0.9f;
      s.top_p = 0.9f;
      s.seed = 500 + i;
    }
    if (i % 4 == 2) s.top_k = 8;
  }
  std::vector<Completion> after_each, ahead;
  {
    LLM llm(cuda_config());
    after_each = llm.generate(requests);
  }
  // A stop token taken from the first run's output ends a request one step early: its row of
  // the step already launched is dropped.
  requests[5].sampling.stop_token_ids = {after_each[5].token_ids[2]};
  requests[5].sampling.ignore_eos = false;
  {
    LLM llm(cuda_config());
    after_each[5] = llm.generate({requests[5]})[0];
  }
  EngineConfig config = cuda_config();
  config.async_scheduling = true;
  {
    LLM llm(config);
    for (int run = 0; run < 3; ++run) ahead = llm.generate(requests);  // the third replays recordings
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(ahead[i].status.ok()) << ahead[i].status.message();
    EXPECT_EQ(ahead[i].token_ids, after_each[i].token_ids) << "request " << i;
    EXPECT_EQ(ahead[i].finish_reason, after_each[i].finish_reason) << "request " << i;
  }
  EXPECT_LE(after_each[5].token_ids.size(), 3u);
}

}  // namespace
}  // namespace dsinfer
