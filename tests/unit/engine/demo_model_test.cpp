// The bundled demo model (models/demo) against the PyTorch/HF reference made by the script that
// trained it: the tokenizer reproduces the reference prompt ids, and the engine's greedy output
// follows the reference wherever the reference is confident.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "dsinfer/llm.h"
#include "test_fixtures.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer {
namespace {

std::string demo_dir() { return std::string(DSINFER_SOURCE_DIR) + "/models/demo"; }

nlohmann::json demo_reference() {
  std::ifstream f(std::string(DSINFER_SOURCE_DIR) + "/tests/data/demo_reference.json");
  return nlohmann::json::parse(f);
}

TEST(DemoModel, TokenizerReproducesReferencePrompts) {
  const auto tok = Tokenizer::load(demo_dir());
  for (const auto& c : demo_reference()["cases"]) {
    EXPECT_EQ(tok->encode(c["prompt_text"].get<std::string>(), true), c["prompt_ids"].get<std::vector<int32_t>>())
        << c["name"];
  }
}

TEST(DemoModel, GreedyOutputFollowsReference) {
  const auto ref = demo_reference();
  EngineConfig config;
  config.model_dir = demo_dir();
  config.kv_cache_bytes = 64 << 20;
  config.print_load_progress = false;
  LLM llm(config);
  std::vector<GenerationRequest> requests;
  for (const auto& c : ref["cases"]) {
    GenerationRequest r;
    r.prompt_ids = c["prompt_ids"].get<std::vector<TokenId>>();
    r.sampling.temperature = 0.0f;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = static_cast<int>(c["greedy_ids"].size());
    requests.push_back(r);
  }
  const auto results = llm.generate(requests);
  int num_compared = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& c = ref["cases"][i];
    ASSERT_TRUE(results[i].status.ok());
    const int agree = testing::agreeing_prefix(results[i].token_ids, c["greedy_ids"].get<std::vector<TokenId>>(),
                                               c["step_margin_top1_top2"].get<std::vector<double>>());
    EXPECT_GE(agree, 0) << c["name"] << " departs from a confident reference token";
    num_compared += std::max(agree, 0);
  }
  EXPECT_GT(num_compared, 100);
}

}  // namespace
}  // namespace dsinfer
