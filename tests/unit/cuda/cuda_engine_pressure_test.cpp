// The engine on the CUDA backend under pressure (tests/support/engine_pressure.h): preempted
// requests computed again, prompts prefilled in chunks over cached prefixes, prefix hits on the
// device, restores from the host tier and the block store, one step scheduled ahead and decode
// steps replayed from recordings. In batch-invariant mode every request gives the tokens it
// gives alone, on each fixture and with either latent cache format. The default mode's kernels
// depend on the batch, and a recorded step pads the batch to its bucket (under this pressure 3
// of 10 seeded requests drew other tokens replayed than eager), so there greedy tokens replayed
// under pressure must follow the eager run's until a step whose top two are near a tie.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "engine_pressure.h"

namespace dsinfer {
namespace {

using testing_cuda::ScopedEnv;

// The fixtures' token ids: tiny_v2_lite has the smallest vocabulary.
constexpr int kVocab = 384;

EngineConfig roomy_config(const std::string& fixture, KvCacheFormat format) {
  EngineConfig c = testing_cuda::tiny_v3_cuda_config();
  c.model_dir = testing_cuda::source_dir() + "/tests/data/" + fixture;
  c.kv_cache_format = format;
  return c;
}

class CudaEnginePressureTest : public ::testing::TestWithParam<std::tuple<std::string, KvCacheFormat>> {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_P(CudaEnginePressureTest, BatchInvariantRequestsGiveTheirTokensAlone) {
  const auto& [fixture, format] = GetParam();
  ScopedEnv invariant("DSINFER_BATCH_INVARIANT", "1");
  test_support::expect_pressure_gives_tokens_alone(roomy_config(fixture, format), kVocab);
}

// Eager top-2 logprob margins below this may flip under the padded step's other low bits.
constexpr float kNearTie = 0.1f;

// The default mode under pressure, replayed against eager: two engines in the same state (each
// with a store of its own) take the same requests, greedy and without penalties, three times;
// the one with recordings replays decode steps from its first run on. A request's replayed
// tokens follow its eager ones up to the first step whose eager top two lie within kNearTie,
// and most follow them whole.
TEST_P(CudaEnginePressureTest, DefaultModeReplayedStepsFollowEagerOnesUpToANearTie) {
  const auto& [fixture, format] = GetParam();
  std::vector<GenerationRequest> requests = test_support::pressure_requests(40, kVocab, 2025);
  for (GenerationRequest& r : requests) {  // greedy on the model's logits, whose margins the logprobs give
    const int max_tokens = r.sampling.max_tokens;
    r.sampling = SamplingParams{};
    r.sampling.temperature = 0.0f;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = max_tokens;
    r.sampling.num_logprobs = 2;
  }
  constexpr int kRuns = 3;
  using Runs = std::vector<std::vector<Completion>>;
  auto run = [&]() {
    test_support::TempDir store;
    LLM llm(test_support::pressure_config(roomy_config(fixture, format), store.path()));
    Runs out;
    for (int r = 0; r < kRuns; ++r) out.push_back(llm.generate(requests));
    EXPECT_GT(llm.engine().stats().num_preemptions, 0);
    return out;
  };
  const Runs replayed = run();
  Runs eager;
  {
    ScopedEnv no_graphs("DSINFER_CUDA_GRAPHS", "0");
    eager = run();
  }
  for (int r = 0; r < kRuns; ++r) {
    int num_whole = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const Completion &got = replayed[r][i], &want = eager[r][i];
      const std::string what = "run " + std::to_string(r + 1) + ", request " + std::to_string(i);
      ASSERT_TRUE(got.status.ok() && want.status.ok()) << what;
      ASSERT_EQ(got.token_ids.size(), static_cast<size_t>(requests[i].sampling.max_tokens)) << what;
      ASSERT_EQ(want.logprobs.size(), want.token_ids.size()) << what;
      size_t same = 0;
      while (same < got.token_ids.size() && got.token_ids[same] == want.token_ids[same]) ++same;
      num_whole += same == got.token_ids.size();
      if (same == got.token_ids.size()) continue;
      const auto& top = want.logprobs[same].top;
      ASSERT_GE(top.size(), 2u) << what;
      EXPECT_LT(top[0].second - top[1].second, kNearTie)
          << what << ": replayed and eager tokens part at step " << same << " where eager's top two are clear";
    }
    std::cout << "run " << r + 1 << ": " << num_whole << " of " << requests.size()
              << " requests replayed whole as eager\n";
    // Near ties part a few requests (on an H100: 33 to 40 of 40 whole per run, tiny_v3_fp8 the
    // fewest); most replaying whole keeps the check above from holding by parting them all.
    EXPECT_GE(num_whole, 24) << "run " << r + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaEnginePressureTest,
                         ::testing::Combine(::testing::Values("tiny_v3", "tiny_v2_lite", "tiny_v3_fp8"),
                                            ::testing::Values(KvCacheFormat::kF32, KvCacheFormat::kFp8)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + kv_cache_format_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace dsinfer
