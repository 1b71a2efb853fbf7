// make_random_weights (--dummy-weights): deterministic per seed, and shaped as the loader's
// comment promises: projections N(0, 1/in), embeddings N(0, 1), norms 1 + N(0, 0.01).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/deepseek_weights.h"
#include "model/model_config.h"

namespace dsinfer {
namespace {

struct Moments {
  double mean = 0, stddev = 0, within_one_stddev = 0;  // the last: fraction within mean ± stddev
};

Moments moments_of(const std::vector<float>& v) {
  Moments m;
  for (float x : v) m.mean += x;
  m.mean /= static_cast<double>(v.size());
  for (float x : v) m.stddev += (x - m.mean) * (x - m.mean);
  m.stddev = std::sqrt(m.stddev / static_cast<double>(v.size()));
  for (float x : v) m.within_one_stddev += std::abs(x - m.mean) <= m.stddev;
  m.within_one_stddev /= static_cast<double>(v.size());
  return m;
}

class RandomWeightsTest : public ::testing::Test {
 protected:
  std::vector<float> host(const Tensor& t) {
    std::vector<float> out(t.num_elements());
    cpu_.to_host(t, out.data());
    return out;
  }
  std::vector<float> host(const LinearWeight& w) { return host(w.weight); }

  ModelConfig config_ = ModelConfig::load(std::string(DSINFER_SOURCE_DIR) + "/tests/data/tiny_v3");
  CpuBackend cpu_;
};

TEST_F(RandomWeightsTest, SameSeedSameValuesOtherSeedOthers) {
  const ModelWeights a = make_random_weights(config_, cpu_, 7);
  const ModelWeights b = make_random_weights(config_, cpu_, 7);
  const ModelWeights c = make_random_weights(config_, cpu_, 8);
  EXPECT_EQ(host(a.embed), host(b.embed));
  EXPECT_EQ(host(a.lm_head), host(b.lm_head));
  EXPECT_EQ(host(a.final_norm), host(b.final_norm));
  EXPECT_NE(host(a.embed), host(c.embed));
  EXPECT_NE(host(a.lm_head), host(c.lm_head));
  // Tensors of one model draw from streams of their own.
  EXPECT_NE(host(a.embed), host(a.lm_head));
}

TEST_F(RandomWeightsTest, ValuesFollowTheirNormalDistributions) {
  const ModelWeights w = make_random_weights(config_, cpu_, 3);
  const double hidden = static_cast<double>(config_.hidden_size);
  // 512 x 64 values each: the sample moments are within a few tenths of a percent.
  const Moments embed = moments_of(host(w.embed));
  EXPECT_NEAR(embed.mean, 0.0, 0.02);
  EXPECT_NEAR(embed.stddev, 1.0, 0.02);
  // A normal distribution has 68.3% of its mass within one standard deviation (a uniform one
  // 57.7%, a sum of few uniforms in between).
  EXPECT_NEAR(embed.within_one_stddev, 0.683, 0.01);
  const Moments head = moments_of(host(w.lm_head));
  EXPECT_NEAR(head.mean, 0.0, 0.02 / std::sqrt(hidden));
  EXPECT_NEAR(head.stddev, 1.0 / std::sqrt(hidden), 0.02 / std::sqrt(hidden));
  EXPECT_NEAR(head.within_one_stddev, 0.683, 0.01);
  const Moments norm = moments_of(host(w.final_norm));
  EXPECT_NEAR(norm.mean, 1.0, 0.05);
  EXPECT_NEAR(norm.stddev, 0.1, 0.04);
}

}  // namespace
}  // namespace dsinfer
