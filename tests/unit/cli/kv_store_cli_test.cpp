// The block store across real `dsinfer generate` processes: a prefix one process computed is
// read by the next, and a process killed while it writes leaves no corrupt object behind.
#include <gtest/gtest.h>
#include "run_binary.h"
#include "json_lines.h"
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "kv/store_object.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;

using dsinfer::testing::RunResult;
RunResult run(const std::string& args) { return dsinfer::testing::run_dsinfer(args); }

std::string fixture(const std::string& name) { return std::string(DSINFER_SOURCE_DIR) + "/tests/data/" + name; }

using dsinfer::testing::json_lines;

using dsinfer::test_support::TempDir;

std::vector<std::string> objects_under(const std::string& dir) {
  // Error-code overloads throughout: a writer renames and creates files while we look.
  std::vector<std::string> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".kvb") out.push_back(it->path().string());
  return out;
}

// Expiry times (mtime) of the store's objects, by path: a read hit moves them forward.
std::map<std::string, int64_t> expiries(const std::string& dir) {
  std::map<std::string, int64_t> out;
  for (const auto& p : objects_under(dir)) {
    struct stat st;
    if (::stat(p.c_str(), &st) == 0) out[p] = st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec;
  }
  return out;
}

// True if the file is a whole, checksummed store object (whatever prefix it holds).
bool is_intact_object(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::span<const std::byte> file(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
  dsinfer::kv::StoreObject header;
  size_t data_offset = 0;
  // Size, magic, version and checksum are checked before the identity; an empty expected
  // identity therefore reports kForeign exactly for intact objects.
  return dsinfer::kv::decode_store_object(file, {}, "", {}, &header, &data_offset) ==
         dsinfer::kv::StoreDecodeStatus::kForeign;
}

std::vector<int> random_prompt(std::mt19937& rng, int n) {
  std::vector<int> p(n);
  for (int& t : p) t = 2 + static_cast<int>(rng() % 500);
  return p;
}

std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

const std::string kCommon = " --model " + fixture("tiny_v3") + " --block-size 16 --temperature 0 --ignore-eos";

TEST(KvStoreCli, SecondProcessReadsWhatTheFirstWrote) {
  TempDir dir;
  std::mt19937 rng(11);
  const std::string ids = join_ids(random_prompt(rng, 200));  // one 128-token store unit
  const std::string args = "generate" + kCommon + " --max-tokens 8 --prompt-ids " + ids;
  const auto cold = run(args + " --no-kv-store");
  ASSERT_EQ(cold.exit_code, 0) << cold.out;
  const auto first = run(args + " --kv-store " + dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.out;
  const auto written = expiries(dir.path());
  ASSERT_EQ(written.size(), 1u);
  ASSERT_TRUE(is_intact_object(written.begin()->first));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // so a renewed expiry differs
  const auto second = run(args + " --kv-store " + dir.path());
  ASSERT_EQ(second.exit_code, 0) << second.out;
  // Same tokens with and without the store; the second process renewed the object's expiry,
  // which only a read hit does.
  EXPECT_EQ(json_lines(first.out)[0]["token_ids"], json_lines(cold.out)[0]["token_ids"]);
  EXPECT_EQ(json_lines(second.out)[0]["token_ids"], json_lines(cold.out)[0]["token_ids"]);
  const auto after = expiries(dir.path());
  ASSERT_EQ(after.size(), 1u);
  EXPECT_GT(after.begin()->second, written.begin()->second);
}

TEST(KvStoreCli, KilledWriterLeavesNoCorruptEntry) {
  TempDir dir;
  const std::string store = dir.path() + "/store";
  std::mt19937 rng(12);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 2000; ++i) prompts.push_back(random_prompt(rng, 140));
  const std::string input = dir.path() + "/prompts.jsonl";
  {
    std::ofstream f(input);
    for (const auto& p : prompts) f << nlohmann::json{{"prompt_ids", p}}.dump() << "\n";
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string args = std::string(DSINFER_BINARY) + " generate" + kCommon +
                             " --max-tokens 1 --max-batched-tokens 280 --input " + input + " --kv-store " + store +
                             " > /dev/null 2>&1";
    ::execl("/bin/sh", "sh", "-c", ("exec " + args).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Kill it with some objects written and more on the way.
  for (int i = 0; i < 30000 && objects_under(store).size() < 6; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer finished before it could be killed";
  const auto objects = objects_under(store);
  ASSERT_GE(objects.size(), 6u);
  for (const auto& p : objects) EXPECT_TRUE(is_intact_object(p)) << p;

  // The next process answers the first prompts exactly as a process without a store does.
  const std::string head = dir.path() + "/head.jsonl";
  {
    std::ofstream f(head);
    for (int i = 0; i < 8; ++i) f << nlohmann::json{{"prompt_ids", prompts[i]}}.dump() << "\n";
  }
  const std::string args = "generate" + kCommon + " --max-tokens 4 --input " + head;
  const auto with_store = run(args + " --kv-store " + store);
  const auto without = run(args + " --no-kv-store");
  ASSERT_EQ(with_store.exit_code, 0) << with_store.out;
  ASSERT_EQ(without.exit_code, 0) << without.out;
  const auto a = json_lines(with_store.out);
  const auto b = json_lines(without.out);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["token_ids"], b[i]["token_ids"]) << i;
  for (const auto& p : objects_under(store)) EXPECT_TRUE(is_intact_object(p)) << p;
}

}  // namespace
