#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
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

}  // namespace
}  // namespace dsinfer
