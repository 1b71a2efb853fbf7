#include "engine/sampler.h"

#include "backend/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

namespace dsinfer {
namespace {

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

TEST(Sampler, GreedyPicksArgmaxAndLowestIdOnTies) {
  SamplerState st(1);
  SamplingParams p;
  p.temperature = 0.0f;
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(sample_token(l.data(), 4, p, st, nullptr), 1);
  p.temperature = 1.0f;
  p.top_k = 1;
  EXPECT_EQ(sample_token(l.data(), 4, p, st, nullptr), 1);
}

TEST(Sampler, SameSeedSameStream) {
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<float> l = logits_of({0.1, 0.2, 0.3, 0.4});
  SamplerState a(7), b(7), c(8);
  std::vector<int> sa, sb, sc;
  for (int i = 0; i < 64; ++i) {
    sa.push_back(sample_token(l.data(), 4, p, a, nullptr));
    sb.push_back(sample_token(l.data(), 4, p, b, nullptr));
    sc.push_back(sample_token(l.data(), 4, p, c, nullptr));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  SamplingParams p;
  p.temperature = 1.0f;
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  std::vector<float> l = logits_of(probs);
  SamplerState st(3);
  std::map<int, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) counts[sample_token(l.data(), 4, p, st, nullptr)]++;
  for (int t = 0; t < 4; ++t) EXPECT_NEAR(counts[t] / double(n), probs[t], 0.01) << t;
}

TEST(Sampler, TopKTopPMinPTruncate) {
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  std::vector<float> l = logits_of(probs);
  SamplerState st(5);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  for (int i = 0; i < 2000; ++i) EXPECT_LT(sample_token(l.data(), 4, p, st, nullptr), 2);
  p.top_k = 0;
  p.top_p = 0.79f;  // 0.5 + 0.3 reaches it: tokens 0 and 1 only
  std::map<int, int> counts;
  for (int i = 0; i < 4000; ++i) counts[sample_token(l.data(), 4, p, st, nullptr)]++;
  EXPECT_EQ(counts.count(2) + counts.count(3), 0u);
  EXPECT_GT(counts[1], 1000);  // renormalised: 0.3 / 0.8
  p.top_p = 1.0f;
  p.min_p = 0.5f;  // keeps p >= 0.25: tokens 0 and 1
  for (int i = 0; i < 2000; ++i) EXPECT_LT(sample_token(l.data(), 4, p, st, nullptr), 2);
}

TEST(Sampler, TemperatureSharpens) {
  const std::vector<double> probs = {0.6, 0.4};
  std::vector<float> l = logits_of(probs);
  SamplerState st(9);
  SamplingParams p;
  p.temperature = 0.25f;  // 0.6^4 : 0.4^4 = 0.835 : 0.165
  int zeros = 0;
  for (int i = 0; i < 20000; ++i) zeros += sample_token(l.data(), 2, p, st, nullptr) == 0;
  EXPECT_NEAR(zeros / 20000.0, 0.835, 0.015);
}

TEST(Sampler, LogprobsAreOfTheModelDistribution) {
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  std::vector<float> l = logits_of(probs);
  for (auto& x : l) x += 3.0f;  // logits are shift-invariant
  SamplerState st(1);
  SamplingParams p;
  p.temperature = 0.0f;
  p.num_logprobs = 3;
  TokenLogprob lp;
  EXPECT_EQ(sample_token(l.data(), 4, p, st, &lp), 0);
  EXPECT_NEAR(lp.logprob, std::log(0.5), 1e-5);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[1].first, 1);
  EXPECT_NEAR(lp.top[2].second, std::log(0.15), 1e-5);
}


// The engine's batched path (one row_sampling per request, then Backend::sample_rows) picks what
// sample_token picks from the same streams: greedy rows draw nothing, the others one number.
TEST(Sampler, BackendRowsFollowTheRequestStreams) {
  auto cpu = make_backend("cpu");
  constexpr int kVocab = 50, kRows = 6, kSteps = 40;
  std::vector<SamplingParams> params(kRows);
  params[0].temperature = 0.0f;
  params[1].top_k = 5;
  params[2].top_p = 0.7f;
  params[3].temperature = 0.6f;
  params[3].min_p = 0.1f;
  params[4].top_k = 1;
  params[5].temperature = 1.5f;
  std::vector<SamplerState> batched, single;
  for (int r = 0; r < kRows; ++r) {
    batched.emplace_back(100 + r);
    single.emplace_back(100 + r);
  }
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  int differs_from_greedy = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> logits(kRows * kVocab);
    for (auto& x : logits) x = dist(rng);
    std::vector<RowSampling> rows;
    for (int r = 0; r < kRows; ++r) rows.push_back(row_sampling(params[r], batched[r]));
    std::vector<int32_t> chosen;
    Tensor t = cpu->from_host(HostTensor{DType::kF32, {kRows, kVocab}, logits.data()});
    cpu->sample_rows(t, rows, chosen);
    ASSERT_EQ(chosen.size(), static_cast<size_t>(kRows));
    for (int r = 0; r < kRows; ++r) {
      const float* row = logits.data() + r * kVocab;
      EXPECT_EQ(chosen[r], sample_token(row, kVocab, params[r], single[r], nullptr)) << "step " << step << " row " << r;
      differs_from_greedy += chosen[r] != std::max_element(row, row + kVocab) - row;
    }
  }
  EXPECT_GT(differs_from_greedy, kSteps);  // the sampled rows did sample
}

}  // namespace
}  // namespace dsinfer
