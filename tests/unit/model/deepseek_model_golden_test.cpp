// The forward pass against HF transformers reference dumps (tests/data/*/reference.json), at
// the model level: prefill logits and greedy decoding through the paged latent cache.
#include "model/deepseek_model.h"

#include <gtest/gtest.h>
#include "teacher_forcing.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"

namespace dsinfer {
namespace {

nlohmann::json load_reference(const std::string& dir) {
  std::ifstream f(dir + "/reference.json");
  return nlohmann::json::parse(f);
}

class GoldenModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenModelTest, MatchesReferenceLogitsAndGreedyTokens) {
  const std::string dir = std::string(DSINFER_SOURCE_DIR) + "/tests/data/" + GetParam();
  auto backend = make_backend("cpu");
  auto model = load_deepseek_model(dir, *backend, 0, false);
  const auto ref = load_reference(dir);
  // Greedy decoding one token at a time through the cache, on the reference's path: every step
  // whose reference top-2 margin passes 1e-3 picks the reference's token.
  const testing::TeacherForcedAgreement a = testing::teacher_forced_agreement(*model, dir, 1e-3);
  EXPECT_GT(a.num_clear, 100);
  EXPECT_EQ(a.num_clear_agree, a.num_clear) << GetParam();
  // Prefill: the last position's logits against the reference.
  for (size_t i = 0; i < a.prefill_logits.size(); ++i) {
    const auto& p = ref["prompts"][i];
    const auto top5_ids = p["top5_ids"].get<std::vector<int>>();
    const auto top5 = p["top5_logits"].get<std::vector<double>>();
    for (int r = 0; r < 5; ++r) {
      EXPECT_NEAR(a.prefill_logits[i][top5_ids[r]], top5[r], 1e-3 * std::max(1.0, std::abs(top5[r])))
          << GetParam() << " prompt " << i << " rank " << r;
    }
    EXPECT_LT(a.prefill_errors[i], 2e-3) << GetParam() << " prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenModelTest,
                         ::testing::Values("tiny_v3", "tiny_v2_lite", "tiny_v3_fp8"));

}  // namespace
}  // namespace dsinfer
