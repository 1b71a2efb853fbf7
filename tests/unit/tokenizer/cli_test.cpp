// Drives the real `dsinfer tokenize` / `dsinfer detokenize` binary.
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include "run_binary.h"
#include <nlohmann/json.hpp>

#include "test_data.h"

namespace dsinfer {
namespace {

using dsinfer::testing::RunResult;
RunResult run(const std::string& args) { return dsinfer::testing::run_dsinfer(args); }

std::string model_arg() { return "--model '" + testing::deepseek_v3_tokenizer_dir() + "'"; }

TEST(TokenizeCli, TextAndDetokenizeRoundTrip) {
  auto r = run("tokenize " + model_arg() + " --text 'Hello world'");
  ASSERT_EQ(r.exit_code, 0);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"], nlohmann::json({19923, 2058}));
  EXPECT_EQ(j["prompt"], "Hello world");
  auto d = run("detokenize " + model_arg() + " --ids 0,19923,2058");
  ASSERT_EQ(d.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(d.out)["text"], "<｜begin▁of▁sentence｜>Hello world");
  auto s = run("detokenize " + model_arg() + " --ids 0,19923,2058 --skip-special");
  EXPECT_EQ(nlohmann::json::parse(s.out)["text"], "Hello world");
}

TEST(TokenizeCli, ChatUsesTheDetectedTemplateAndOverride) {
  const std::string path = ::testing::TempDir() + "/chat.json";
  std::ofstream(path) << R"({"messages":[{"role":"system","content":"S"},{"role":"user","content":"hi"}]})";
  auto r = run("tokenize " + model_arg() + " --chat '" + path + "' --add-generation-prompt");
  ASSERT_EQ(r.exit_code, 0);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt"], "<｜begin▁of▁sentence｜>S<｜User｜>hi<｜Assistant｜>");
  EXPECT_EQ(j["ids"].front(), 0);
  EXPECT_EQ(j["ids"].back(), 128804);
  auto r1 = run("tokenize " + model_arg() + " --chat '" + path + "' --add-generation-prompt --template r1");
  ASSERT_EQ(r1.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(r1.out)["prompt"], "<｜begin▁of▁sentence｜>S<｜User｜>hi<｜Assistant｜><think>\n");
}

TEST(TokenizeCli, BadInputGivesNonZeroExit) {
  EXPECT_NE(run("tokenize " + model_arg()).exit_code, 0);
  EXPECT_NE(run("tokenize " + model_arg() + " --text a --template v9").exit_code, 0);
  EXPECT_NE(run("tokenize --model /nonexistent --text a").exit_code, 0);
  EXPECT_NE(run("detokenize " + model_arg() + " --ids 1,abc").exit_code, 0);
  EXPECT_NE(run("detokenize " + model_arg() + " --ids 99999999").exit_code, 0);
  const std::string path = ::testing::TempDir() + "/bad_chat.json";
  std::ofstream(path) << R"({"messages":[{"role":"robot","content":"x"}]})";
  EXPECT_NE(run("tokenize " + model_arg() + " --chat '" + path + "'").exit_code, 0);
}

}  // namespace
}  // namespace dsinfer
