// The forward pass against HF transformers reference dumps (tests/data/*/reference.json), at
// the model level: prefill logits and greedy decoding through the paged latent cache.
#include "model/deepseek_model.h"

#include <gtest/gtest.h>
#include "forward_batch_util.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"

namespace dsinfer {
namespace {

constexpr int kBlockSize = 64;

nlohmann::json load_reference(const std::string& dir) {
  std::ifstream f(dir + "/reference.json");
  return nlohmann::json::parse(f);
}

// Fills a batch of one sequence whose tokens [start, start + n) are new; blocks 0..k in order.
ForwardBatch single_sequence_batch(const std::vector<TokenId>& tokens, int start, int num_blocks) {
  return testing::single_sequence_batch(tokens, start, num_blocks, kBlockSize);
}

class GoldenModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenModelTest, MatchesReferenceLogitsAndGreedyTokens) {
  const std::string dir = std::string(DSINFER_SOURCE_DIR) + "/tests/data/" + GetParam();
  auto backend = make_backend("cpu");
  auto model = load_deepseek_model(dir, *backend, 0, false);
  const auto ref = load_reference(dir);
  int num_checked_tokens = 0;
  for (const auto& p : ref["prompts"]) {
    std::vector<TokenId> tokens = p["prompt_ids"].get<std::vector<TokenId>>();
    const auto greedy = p["greedy_ids"].get<std::vector<TokenId>>();
    const auto margins = p["greedy_margins"].get<std::vector<double>>();
    const int total = static_cast<int>(tokens.size() + greedy.size());
    const int num_blocks = (total + kBlockSize - 1) / kBlockSize;
    KvCaches caches = model->allocate_caches(num_blocks, kBlockSize);

    // Prefill: the last position's logits against the reference.
    ForwardOutput out = model->forward(single_sequence_batch(tokens, 0, num_blocks), caches);
    std::vector<float> logits(model->config().vocab_size);
    backend->to_host(out.logits, logits.data());
    const auto top5_ids = p["top5_ids"].get<std::vector<int>>();
    const auto top5 = p["top5_logits"].get<std::vector<double>>();
    for (int i = 0; i < 5; ++i) {
      EXPECT_NEAR(logits[top5_ids[i]], top5[i], 1e-3 * std::max(1.0, std::abs(top5[i])))
          << GetParam() << " prompt len " << tokens.size() << " rank " << i;
    }
    const auto full = p["last_logits"].get<std::vector<double>>();
    double max_err = 0;
    for (size_t v = 0; v < full.size(); ++v) max_err = std::max(max_err, std::abs(logits[v] - full[v]));
    EXPECT_LT(max_err, 2e-3) << GetParam() << " prompt len " << tokens.size();

    // Greedy decoding one token at a time through the cache.
    for (size_t step = 0; step < greedy.size(); ++step) {
      const int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (margins[step] > 1e-3) {
        EXPECT_EQ(next, greedy[step]) << GetParam() << " prompt len " << tokens.size() << " step " << step;
        ++num_checked_tokens;
      }
      tokens.push_back(greedy[step]);  // teacher-forced: follow the reference path
      out = model->forward(single_sequence_batch(tokens, static_cast<int>(tokens.size()) - 1, num_blocks), caches);
      backend->to_host(out.logits, logits.data());
    }
  }
  EXPECT_GT(num_checked_tokens, 100);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenModelTest,
                         ::testing::Values("tiny_v3", "tiny_v2_lite", "tiny_v3_fp8"));

}  // namespace
}  // namespace dsinfer
