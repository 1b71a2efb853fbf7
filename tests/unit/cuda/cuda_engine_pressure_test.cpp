// The engine on the CUDA backend under pressure (tests/support/engine_pressure.h): preempted
// requests computed again, prompts prefilled in chunks over cached prefixes, prefix hits on the
// device, restores from the host tier and the block store, one step scheduled ahead and decode
// steps replayed from recordings. In batch-invariant mode every request gives the tokens it
// gives alone, on each fixture and with either latent cache format. The default mode's kernels
// depend on the batch, and a recorded step pads the batch to its bucket, so there replayed
// steps are held to eager steps padded alike, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
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

// Where a replayed request's tokens or log-probabilities first differ from the padded eager
// run's, step by step up to there: each run's token, its log-probability and its top-two margin.
bool same_logprobs(const TokenLogprob& a, const TokenLogprob& b) { return a.logprob == b.logprob && a.top == b.top; }

std::string describe_parting(const Completion& replayed, const Completion& eager) {
  size_t parting = 0;
  auto same_step = [&](size_t k) {
    return replayed.token_ids[k] == eager.token_ids[k] && same_logprobs(replayed.logprobs[k], eager.logprobs[k]);
  };
  while (parting < eager.token_ids.size() && same_step(parting)) ++parting;
  std::ostringstream s;
  s << "first difference at step " << parting << "; step: eager token logprob margin | replayed ...\n";
  for (size_t k = 0; k <= parting && k < eager.token_ids.size(); ++k) {
    for (const Completion* c : {&eager, &replayed}) {
      const TokenLogprob& l = c->logprobs[k];
      const float margin = l.top.size() >= 2 ? l.top[0].second - l.top[1].second : 0.0f;
      s << (c == &eager ? std::to_string(k) + ": " : " | ") << c->token_ids[k] << " " << l.logprob << " " << margin;
    }
    s << "\n";
  }
  return s.str();
}

// The default mode under pressure, replayed against eager: two engines in the same state (each
// with a store of its own) take the same requests, greedy and without penalties, three times.
// One replays its decode steps from recordings; the other pads them to the same buckets but
// issues them eagerly (DSINFER_CUDA_GRAPHS=padded). Steps issued as they come are no reference
// here: padding moves a step onto other kernels (three sequences padded to four take the
// few-token tiles' TF32 products instead of the fp32 split kernel, nine padded to sixteen the
// head tiles), which moved the tiny fixtures' logits by up to 1.4 within one step and parted greedy
// tokens at top-two margins up to 0.56. Padded alike, a replay must give the eager step's bits:
// every request's tokens and log-probabilities match.
TEST_P(CudaEnginePressureTest, DefaultModeReplayedStepsGiveThePaddedEagerStepsBits) {
  const auto& [fixture, format] = GetParam();
  std::vector<GenerationRequest> requests = test_support::pressure_requests(40, kVocab, 2025);
  for (GenerationRequest& r : requests) {  // greedy on the model's logits, whose values the logprobs give
    const int max_tokens = r.sampling.max_tokens;
    r.sampling = SamplingParams{};
    r.sampling.temperature = 0.0f;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = max_tokens;
    r.sampling.num_logprobs = 2;
  }
  constexpr int kRuns = 3;
  using Runs = std::vector<std::vector<Completion>>;
  auto run = [&](int64_t& num_replayed_steps) {
    test_support::TempDir store;
    LLM llm(test_support::pressure_config(roomy_config(fixture, format), store.path()));
    Runs out;
    for (int r = 0; r < kRuns; ++r) out.push_back(llm.generate(requests));
    EXPECT_GT(llm.engine().stats().num_preemptions, 0);
    num_replayed_steps = llm.engine().stats().num_replayed_steps;
    return out;
  };
  int64_t num_replayed = 0, num_replayed_padded = 0;
  const Runs replayed = run(num_replayed);
  Runs padded;
  {
    ScopedEnv padded_eager("DSINFER_CUDA_GRAPHS", "padded");
    padded = run(num_replayed_padded);
  }
  // Of the three runs' some 200 decode-only steps, about 190 replay (tiny_v3_fp8, FP8 cache).
  EXPECT_GT(num_replayed, 100) << "decode steps replayed";
  EXPECT_EQ(num_replayed_padded, 0) << "the padded engine records nothing";
  for (int r = 0; r < kRuns; ++r) {
    for (size_t i = 0; i < requests.size(); ++i) {
      const Completion &got = replayed[r][i], &want = padded[r][i];
      const std::string what = "run " + std::to_string(r + 1) + ", request " + std::to_string(i);
      ASSERT_TRUE(got.status.ok() && want.status.ok()) << what;
      ASSERT_EQ(got.token_ids.size(), static_cast<size_t>(requests[i].sampling.max_tokens)) << what;
      ASSERT_EQ(want.token_ids.size(), got.token_ids.size()) << what;
      ASSERT_EQ(got.logprobs.size(), got.token_ids.size()) << what;
      ASSERT_EQ(want.logprobs.size(), want.token_ids.size()) << what;
      EXPECT_EQ(got.token_ids, want.token_ids) << what << ": " << describe_parting(got, want);
      EXPECT_TRUE(std::equal(got.logprobs.begin(), got.logprobs.end(), want.logprobs.begin(), same_logprobs))
          << what << ": " << describe_parting(got, want);
    }
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
