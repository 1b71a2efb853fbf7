// tools/serving_model_dir.py, which makes a model directory for serving benchmarks with random
// weights: the config and a tokenizer that gives text for every id of its vocabulary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "json_lines.h"
#include "run_binary.h"

namespace dsinfer {
namespace {

using testing::json_lines;
using testing::run_dsinfer;
using testing::run_tool;

// The word the tool gives id (272 and above): two letters or digits, then three.
std::string word_of(int id) {
  const std::string alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  const int n = static_cast<int>(alnum.size()), i = id - 272;
  if (i < n * n) return {alnum[i / n], alnum[i % n]};
  const int j = i - n * n;
  return {alnum[j / (n * n)], alnum[j / n % n], alnum[j % n]};
}

TEST(ServingModelDirTest, GeneratedIdsComeBackAsTheirWords) {
  const std::string dir = ::testing::TempDir() + "/serving_model_dir";
  std::filesystem::remove_all(dir);
  const std::string config = std::string(DSINFER_SOURCE_DIR) + "/tests/data/tiny_v3/config.json";
  const auto made = run_tool("serving_model_dir.py", config + " " + dir);
  ASSERT_EQ(made.exit_code, 0) << made.out;
  EXPECT_NE(made.out.find("tokenizer of 512 ids"), std::string::npos) << made.out;
  // Text prompts take the byte tokens ('h' is byte 104, id 120).
  const auto tok = run_dsinfer("tokenize --model " + dir + " --text hello");
  ASSERT_EQ(tok.exit_code, 0) << tok.out;
  EXPECT_NE(tok.out.find("\"ids\":[120,117,124,124,127]"), std::string::npos) << tok.out;
  // Random weights: whatever ids come out, each one past the byte tokens is its word in the
  // text, in order.
  const auto gen = run_dsinfer("generate --model " + dir + " --dummy-weights --prompt-ids 300,400,500 --max-tokens 24" +
                               " --temperature 0 --ignore-eos");
  ASSERT_EQ(gen.exit_code, 0) << gen.out;
  const auto lines = json_lines(gen.out);
  ASSERT_EQ(lines.size(), 1u) << gen.out;
  const std::string text = lines[0]["text"];
  int num_words = 0;
  size_t at = 0;
  for (int id : lines[0]["token_ids"]) {
    if (id < 272) continue;
    const size_t found = text.find(word_of(id), at);
    ASSERT_NE(found, std::string::npos) << "id " << id << " (" << word_of(id) << ") in " << text;
    at = found + word_of(id).size();
    ++num_words;
  }
  EXPECT_GT(num_words, 4) << gen.out;
}

TEST(ServingModelDirTest, AVocabularyTooSmallForTheByteTokensIsRefused) {
  const std::string dir = ::testing::TempDir() + "/serving_model_dir_small";
  const std::string config = ::testing::TempDir() + "/small_vocab_config.json";
  std::filesystem::remove_all(dir);
  std::ofstream(config) << "{\"vocab_size\": 100}";
  const auto r = run_tool("serving_model_dir.py", config + " " + dir);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("vocab_size 100 is outside"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/tokenizer.json"));
}

}  // namespace
}  // namespace dsinfer
