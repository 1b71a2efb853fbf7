// The differential test: our encoder against the JavaScript encoder of @lenml/tokenizers
// (run under Node in the same test) on a corpus of ≥ 2,000 varied strings.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "differential_corpus.h"
#include "test_data.h"

namespace dsinfer {
namespace {

TEST(TokenizerDifferential, SameIdsAsJavaScriptEncoderAndRoundTrip) {
  const Tokenizer& t = testing::deepseek_v3_tokenizer();
  const auto corpus = testing::tokenizer_differential_corpus(2500, 20261129);
  ASSERT_GE(corpus.size(), 2000u);

  const auto dir = std::filesystem::temp_directory_path() / ("dsinfer_tok_diff_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto in_path = dir / "in.jsonl", out_path = dir / "out.jsonl";
  {
    std::ofstream in(in_path);
    for (const auto& s : corpus) in << nlohmann::json(s).dump() << "\n";
  }
  const std::string cmd = "cd '" + testing::tokenizer_oracle_dir() + "' && node encode.js ids '" + in_path.string() +
                          "' '" + out_path.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the Node reference encoder failed: " << cmd;

  std::ifstream out(out_path);
  std::string line;
  size_t i = 0, num_mismatches = 0;
  while (std::getline(out, line)) {
    ASSERT_LT(i, corpus.size());
    const auto expected = nlohmann::json::parse(line).get<std::vector<int32_t>>();
    const auto got = t.encode(corpus[i]);
    if (got != expected && ++num_mismatches <= 10) {
      ADD_FAILURE() << "ids differ for " << nlohmann::json(corpus[i]).dump() << "\n ours: " << nlohmann::json(got).dump()
                    << "\n   js: " << nlohmann::json(expected).dump();
    }
    EXPECT_EQ(t.decode(got), corpus[i]);
    ++i;
  }
  EXPECT_EQ(i, corpus.size());
  EXPECT_EQ(num_mismatches, 0u) << "of " << corpus.size() << " strings";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dsinfer
