// End-to-end engine runs against the HF transformers reference: every prompt of a fixture in one
// batch (mixed lengths, continuous batching), under tight token budgets (chunked prefill) and
// tiny KV pools (preemption and recompute).
#include <gtest/gtest.h>

#include "dsinfer/llm.h"
#include "engine/engine_core.h"
#include "test_fixtures.h"

namespace dsinfer {
namespace {

struct Variant {
  const char* fixture;
  int max_batched_tokens;
  int num_kv_blocks;  // 0: plenty
};

void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.fixture << " budget " << v.max_batched_tokens << " blocks " << v.num_kv_blocks;
}

class LlmGoldenTest : public ::testing::TestWithParam<Variant> {};

TEST_P(LlmGoldenTest, GreedyTokensMatchReference) {
  const Variant v = GetParam();
  const auto ref = testing::fixture_reference(v.fixture);
  EngineConfig config = testing::fixture_engine_config(v.fixture);
  config.max_num_batched_tokens = v.max_batched_tokens;
  config.num_kv_blocks = v.num_kv_blocks;
  LLM llm(config);
  std::vector<GenerationRequest> requests;
  for (const auto& p : ref["prompts"]) {
    GenerationRequest r;
    r.prompt_ids = p["prompt_ids"].get<std::vector<TokenId>>();
    r.sampling.temperature = 0.0f;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = ref["num_greedy_tokens"].get<int>();
    requests.push_back(r);
  }
  const auto results = llm.generate(requests);
  ASSERT_EQ(results.size(), requests.size());
  int num_compared = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& p = ref["prompts"][i];
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.to_string();
    EXPECT_EQ(results[i].finish_reason, FinishReason::kLength);
    ASSERT_EQ(results[i].token_ids.size(), static_cast<size_t>(ref["num_greedy_tokens"].get<int>()));
    const int agree = testing::agreeing_prefix(results[i].token_ids, p["greedy_ids"].get<std::vector<TokenId>>(),
                                               p["greedy_margins"].get<std::vector<double>>());
    EXPECT_GE(agree, 0) << v.fixture << " prompt " << i << " departs from a confident reference token";
    num_compared += std::max(agree, 0);
  }
  EXPECT_GT(num_compared, 80);
  if (v.num_kv_blocks > 0) {
    EXPECT_GT(llm.engine().stats().num_preemptions, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, LlmGoldenTest,
    ::testing::Values(Variant{"tiny_v3", 2048, 0}, Variant{"tiny_v2_lite", 2048, 0}, Variant{"tiny_v3_fp8", 2048, 0},
                      Variant{"tiny_v3", 7, 0},     // chunked prefill mixed with decodes
                      Variant{"tiny_v3", 64, 6}),   // a pool too small for all: preemption
    [](const auto& info) {
      return std::string(info.param.fixture) + "_budget" + std::to_string(info.param.max_batched_tokens) + "_blocks" +
             std::to_string(info.param.num_kv_blocks);
    });

}  // namespace
}  // namespace dsinfer
