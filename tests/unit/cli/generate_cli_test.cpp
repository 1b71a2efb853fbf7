// `dsinfer generate` as a user runs it: the real binary, its exit codes and JSON lines.
#include <gtest/gtest.h>
#include "run_binary.h"
#include "json_lines.h"
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace {

using dsinfer::testing::RunResult;
RunResult run(const std::string& args) { return dsinfer::testing::run_dsinfer(args); }

std::string fixture(const std::string& name) { return std::string(DSINFER_SOURCE_DIR) + "/tests/data/" + name; }

using dsinfer::testing::json_lines;

nlohmann::json reference(const std::string& name) {
  std::ifstream f(fixture(name) + "/reference.json");
  return nlohmann::json::parse(f);
}

std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

TEST(GenerateCli, ReproducesReferenceTokens) {
  for (const char* name : {"tiny_v3", "tiny_v2_lite", "tiny_v3_fp8"}) {
    const auto ref = reference(name);
    const auto& p = ref["prompts"][2];
    const auto r = run("generate --model " + fixture(name) + " --prompt-ids " +
                       join_ids(p["prompt_ids"].get<std::vector<int>>()) +
                       " --temperature 0 --ignore-eos --max-tokens 24");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const auto lines = json_lines(r.out);
    ASSERT_EQ(lines.size(), 1u) << r.out;
    EXPECT_EQ(lines[0]["index"], 0);
    EXPECT_EQ(lines[0]["finish_reason"], "length");
    EXPECT_EQ(lines[0]["prompt_ids"], p["prompt_ids"]);
    const auto ours = lines[0]["token_ids"].get<std::vector<int>>();
    const auto theirs = p["greedy_ids"].get<std::vector<int>>();
    const auto margins = p["greedy_margins"].get<std::vector<double>>();
    ASSERT_EQ(ours.size(), 24u);
    for (size_t i = 0; i < ours.size(); ++i) {
      if (ours[i] != theirs[i]) {
        EXPECT_LE(margins[i], 1e-3) << name << " token " << i;
        break;
      }
    }
  }
}

// Eight greedy tokens of tiny_v3's third reference prompt, with `options`.
RunResult generate_eight_tokens(const nlohmann::json& prompt, const std::string& options) {
  return run("generate --model " + fixture("tiny_v3") + " --prompt-ids " +
             join_ids(prompt["prompt_ids"].get<std::vector<int>>()) + " --temperature 0 --ignore-eos --max-tokens 8 " +
             options);
}

// --kv-cache-dtype fp8 runs the engine over the FP8 latent cache (logged), and an unknown
// format is refused before anything loads.
TEST(GenerateCli, Fp8LatentCacheOption) {
  const auto ref = reference("tiny_v3");
  const auto r = generate_eight_tokens(ref["prompts"][2], "--kv-cache-dtype fp8");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("tokens (fp8)"), std::string::npos) << r.out;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  EXPECT_EQ(lines[0]["token_ids"].size(), 8u);
  const auto bad = run("generate --model " + fixture("tiny_v3") + " --prompt-ids 1,2 --kv-cache-dtype int4");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("kv-cache-dtype"), std::string::npos) << bad.out;
}

// --precision fp32 is accepted (the CPU backend is fp32 either way: the reference's tokens), and
// an unknown precision is refused before anything loads.
TEST(GenerateCli, PrecisionOption) {
  const auto ref = reference("tiny_v3");
  const auto& p = ref["prompts"][2];
  const auto r = generate_eight_tokens(p, "--precision fp32");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  const auto ours = lines[0]["token_ids"].get<std::vector<int>>();
  const auto theirs = p["greedy_ids"].get<std::vector<int>>();
  const auto margins = p["greedy_margins"].get<std::vector<double>>();
  ASSERT_EQ(ours.size(), 8u);
  const size_t first_miss = std::mismatch(ours.begin(), ours.end(), theirs.begin()).first - ours.begin();
  if (first_miss < ours.size()) {
    EXPECT_LE(margins[first_miss], 1e-3) << "token " << first_miss << " departs from a confident reference token";
  }
  const auto bad = run("generate --model " + fixture("tiny_v3") + " --prompt-ids 1,2 --precision fp16");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("precision"), std::string::npos) << bad.out;
}

TEST(GenerateCli, JsonlInputKeepsOrderAndPerLineParameters) {
  const auto ref = reference("tiny_v3");
  const std::string path = ::testing::TempDir() + "/gen_input.jsonl";
  {
    std::ofstream f(path);
    for (int i = 0; i < 4; ++i) {
      nlohmann::json j{{"prompt_ids", ref["prompts"][i]["prompt_ids"]}, {"max_tokens", 3 + i}, {"temperature", 0}};
      f << j.dump() << "\n";
    }
    f << "\n";  // blank lines are skipped
  }
  const auto r = run("generate --model " + fixture("tiny_v3") + " --input " + path + " --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(lines[i]["index"], i);
    EXPECT_EQ(lines[i]["token_ids"].size(), static_cast<size_t>(3 + i));
  }
}

TEST(GenerateCli, BadInputGetsClearErrors) {
  auto r = run("generate --model " + fixture("tiny_v3"));  // no prompt source
  EXPECT_NE(r.exit_code, 0);
  r = run("generate --model " + fixture("tiny_v3") + " --prompt-ids 1,x,3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("'x' is not a token id"), std::string::npos) << r.out;
  r = run("generate --model " + fixture("tiny_v3") + " --prompt-ids 1,2 --temperature -1");
  EXPECT_NE(r.exit_code, 0);
  r = run("generate --model /nonexistent/model --prompt-ids 1,2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("/nonexistent/model"), std::string::npos) << r.out;
  const std::string path = ::testing::TempDir() + "/bad.jsonl";
  std::ofstream(path) << "{\"prompt_ids\": [1, 2]}\n{not json\n";
  r = run("generate --model " + fixture("tiny_v3") + " --input " + path);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("input line 2"), std::string::npos) << r.out;
  r = run("generate --model " + fixture("tiny_v3") + " --prompt-ids 1,2,999999");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("outside the vocabulary"), std::string::npos) << r.out;
  r = run("generate --model " + fixture("tiny_v3") + " --prompt \"hello\"");  // fixture has no tokenizer
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("tokenizer"), std::string::npos) << r.out;
  r = run("no-such-command");
  EXPECT_NE(r.exit_code, 0);
}

TEST(GenerateCli, CorruptCheckpointIsAnErrorNotACrash) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "truncated_model";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fixture("tiny_v3") + "/config.json", dir / "config.json");
  {
    std::ifstream in(fixture("tiny_v3") + "/model.safetensors", std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(dir / "model.safetensors", std::ios::binary).write(data.data(), data.size() / 2);
  }
  const auto r = run("generate --model " + dir.string() + " --prompt-ids 1,2");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
}

}  // namespace

namespace {

// The engine's "N KV blocks of" line, or -1.
int num_kv_blocks_logged(const std::string& out) {
  const size_t at = out.find(" KV blocks of ");
  if (at == std::string::npos) return -1;
  size_t begin = at;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(out[begin - 1]))) --begin;
  return std::stoi(out.substr(begin, at - begin));
}

}  // namespace

// The KV cache's size: 1 GiB on the cpu backend unless --kv-cache-mb says otherwise; the share of
// the GPU's memory (--gpu-memory-utilization) does not apply there, and both at once are refused.
TEST(GenerateCli, KvCacheSizeByFlagAndBackend) {
  const std::string base = "generate --model " + fixture("tiny_v3") + " --prompt-ids 5,6,7 --max-tokens 2";
  const auto by_default = run(base);
  ASSERT_EQ(by_default.exit_code, 0) << by_default.out;
  const auto small = run(base + " --kv-cache-mb 16");
  ASSERT_EQ(small.exit_code, 0) << small.out;
  const auto share = run(base + " --gpu-memory-utilization 0.5");
  ASSERT_EQ(share.exit_code, 0) << share.out;
  const int default_blocks = num_kv_blocks_logged(by_default.out);
  EXPECT_GT(default_blocks, 0) << by_default.out;
  EXPECT_EQ(num_kv_blocks_logged(small.out), default_blocks / 64) << small.out;  // 16 MiB of 1 GiB
  EXPECT_EQ(num_kv_blocks_logged(share.out), default_blocks) << share.out;

  const auto both = run(base + " --kv-cache-mb 16 --gpu-memory-utilization 0.5");
  EXPECT_NE(both.exit_code, 0) << both.out;
  EXPECT_NE(both.exit_code, -1) << "must not crash: " << both.out;
  EXPECT_NE(both.out.find("excludes"), std::string::npos) << both.out;
}

// A step that fails (here made to fail: DSINFER_INJECT_FAULTS) ends its prompt with an error
// line naming the failure, and the run with exit code 1; no crash.
TEST(GenerateCli, AFailedStepIsAnErrorLine) {
  const auto r = dsinfer::testing::run_command("DSINFER_INJECT_FAULTS=forward:2 " + std::string(DSINFER_BINARY) +
                                               " generate --model " + fixture("tiny_v3") +
                                               " --prompt-ids 5,6,7 --max-tokens 4 --ignore-eos");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  ASSERT_TRUE(lines[0].contains("error")) << r.out;
  EXPECT_NE(lines[0]["error"].get<std::string>().find("injected fault at forward"), std::string::npos) << r.out;
}
