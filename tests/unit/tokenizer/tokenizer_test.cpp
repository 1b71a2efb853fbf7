#include "tokenizer/tokenizer.h"

#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "test_data.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/utf8.h"

namespace dsinfer {
namespace {

using testing::deepseek_v3_tokenizer;

TEST(Tokenizer, LoadsDeepSeekV3) {
  const Tokenizer& t = deepseek_v3_tokenizer();
  EXPECT_EQ(t.vocab_size(), 128815);
  EXPECT_EQ(t.bos_token(), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(t.eos_token(), "<｜end▁of▁sentence｜>");
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_TRUE(t.is_special(0));
  EXPECT_FALSE(t.is_special(128803));  // <｜User｜> is an added token, not a special one
  EXPECT_TRUE(t.is_added(128803));
  EXPECT_EQ(t.token_to_id("<｜User｜>"), 128803);
  EXPECT_EQ(t.token_to_id("Ġt"), t.encode(" t").at(0));
  EXPECT_FALSE(t.token_to_id("no such token at all").has_value());
  EXPECT_NE(t.chat_template().find("<｜Assistant｜>"), std::string::npos);
}

TEST(Tokenizer, KnownIds) {
  // Ids from the JavaScript reference encoder.
  const Tokenizer& t = deepseek_v3_tokenizer();
  EXPECT_EQ(t.encode("Hello world! 12345 你好世界 こんにちは"),
            (std::vector<int32_t>{19923, 2058, 3, 223, 6895, 1883, 223, 30594, 3427, 223, 4549, 7245, 2298, 12457, 2841}));
  EXPECT_EQ(t.encode("<｜User｜>hi<｜Assistant｜>  \n\n  x"),
            (std::vector<int32_t>{128803, 6366, 128804, 6776, 223, 1527}));
}

TEST(Tokenizer, AllowSpecialOffEncodesTokenTextAsPlainText) {
  const Tokenizer& t = deepseek_v3_tokenizer();
  const auto with = t.encode("a<｜User｜>b", true);
  const auto without = t.encode("a<｜User｜>b", false);
  EXPECT_EQ(with.size(), 3u);
  EXPECT_GT(without.size(), 3u);
  for (int32_t id : without) EXPECT_FALSE(t.is_added(id));
  EXPECT_EQ(t.decode(without), "a<｜User｜>b");
}

TEST(Tokenizer, LongestAddedTokenWins) {
  const Tokenizer& t = deepseek_v3_tokenizer();
  // "<｜tool▁calls▁begin｜>" shares a prefix with "<｜tool▁call▁begin｜>".
  EXPECT_EQ(t.encode("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"), (std::vector<int32_t>{128806, 128808}));
}

TEST(Tokenizer, DecodeSkipsSpecialOnRequestOnly) {
  const Tokenizer& t = deepseek_v3_tokenizer();
  const std::vector<int32_t> ids = {0, 128803, 6366, 1};
  EXPECT_EQ(t.decode(ids), "<｜begin▁of▁sentence｜><｜User｜>hi<｜end▁of▁sentence｜>");
  EXPECT_EQ(t.decode(ids, true), "<｜User｜>hi");
}

TEST(Tokenizer, DecodeReplacesBrokenUtf8AndSkipsUnknownIds) {
  const Tokenizer& t = deepseek_v3_tokenizer();
  auto ids = t.encode("你");
  ASSERT_FALSE(ids.empty());
  // A lone byte token of a multibyte character decodes to U+FFFD.
  const auto byte_id = t.encode("\xE4");  // invalid input: encoded as its byte token
  ASSERT_EQ(byte_id.size(), 1u);
  EXPECT_EQ(t.decode(byte_id), "\xEF\xBF\xBD");
  const std::vector<int32_t> bad = {-5, 999999999, byte_id[0]};
  EXPECT_EQ(t.decode(bad), "\xEF\xBF\xBD");
}

TEST(Tokenizer, InvalidUtf8InputRoundTripsAsBytes) {
  const Tokenizer& t = deepseek_v3_tokenizer();
  const std::string s = "ok \xFF\xFE bad \xE4\xBD then \xC3\xA9t\xC3";
  const auto ids = t.encode(s);
  std::string raw;
  for (int32_t id : ids) raw += t.token_bytes(id);
  EXPECT_EQ(raw, s);
}

TEST(Tokenizer, ParallelEncodeEqualsSequential) {
  const Tokenizer& base = deepseek_v3_tokenizer();
  // A text long enough to be cut into many chunks, with every kind of boundary.
  std::mt19937 rng(7);
  const std::vector<std::string> parts = {"word ", "Word\n", "\n\n", "  ", "123456", "你好", "。\n", "\t",
                                          "<｜User｜>", "x.y ", "émoji 👍🏽 ", "\r\n", "  \n", "foo(bar) ", "a"};
  std::string text;
  while (text.size() < 400000) text += parts[rng() % parts.size()];
  const auto seq = base.encode_sequential(text);
  const auto par = base.encode(text);
  EXPECT_EQ(seq, par);
  EXPECT_EQ(base.decode(par), text);
}

TEST(Tokenizer, SafeCutsSplitLikeTheWhole) {
  const Tokenizer& t = deepseek_v3_tokenizer();
  // At each safe cut of a varied text, encoding the halves gives the ids of the whole.
  const std::string text =
      "def f(x):\n    return x+1\n\n# comment 12345\nThe quick brown fox, 你好。\n  \n!bang\nword word\n";
  const auto whole = t.encode_sequential(text);
  for (size_t from = 0; from < text.size(); ++from) {
    const size_t cut = Tokenizer::find_safe_cut(text, from, 8);
    if (cut == std::string::npos || cut >= text.size()) continue;
    auto left = t.encode_sequential(text.substr(0, cut));
    const auto right = t.encode_sequential(text.substr(cut));
    left.insert(left.end(), right.begin(), right.end());
    EXPECT_EQ(left, whole) << "cut at " << cut;
  }
}

TEST(BpeModel, HeapAndScanMergeTheSame) {
  const Tokenizer& t = deepseek_v3_tokenizer();
  (void)t;
  // Build a small synthetic model: bytes a,b,c and merges that compete.
  int32_t byte_ids[256];
  for (int b = 0; b < 256; ++b) byte_ids[b] = b;
  std::vector<tok::BpeModel::Merge> merges = {
      {'a', 'b', 300}, {'b', 'c', 301}, {'a', 'a', 302}, {300, 'c', 303}, {302, 302, 304}, {'c', 'a', 305}, {305, 300, 306}};
  tok::BpeModel model(byte_ids, merges);
  std::mt19937 rng(3);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) s.push_back("abc"[rng() % 3]);
    std::vector<int32_t> a, b;
    model.merge_bytes(s, false, a);
    model.merge_bytes(s, true, b);
    ASSERT_EQ(a, b) << s;
  }
  std::vector<int32_t> out;
  model.merge_bytes("aaaa", false, out);
  EXPECT_EQ(out, (std::vector<int32_t>{304}));
}

// A tiny byte-level tokenizer.json: the 256 byte tokens, "ab", "abc", merges in either form.
nlohmann::json tiny_tokenizer_json(bool pair_merges) {
  nlohmann::json vocab = nlohmann::json::object();
  // Printable ASCII stands for itself in the ByteLevel alphabet; other bytes map above U+0100.
  int next_extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? b : 256 + next_extra++;
    std::string s;
    tok::append_utf8(cp, s);
    vocab[s] = b;
  }
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab["Ġa"] = 258;
  nlohmann::json merges = pair_merges ? nlohmann::json::parse(R"([["a","b"],["ab","c"],["Ġ","a"]])")
                                      : nlohmann::json::parse(R"(["a b","ab c","Ġ a"])");
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
          {"added_tokens", nlohmann::json::parse(R"([{"id": 300, "content": "<eos>", "special": true}])")},
          {"pre_tokenizer", nlohmann::json::parse(R"({"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": " ?[a-z]+"}, "behavior": "Isolated", "invert": false},
              {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})")}};
}

TEST(Tokenizer, MergesInStringAndPairFormsAgree) {
  const nlohmann::json config = {{"bos_token", "<eos>"}, {"eos_token", {{"content", "<eos>"}}}, {"chat_template", "x"}};
  auto a = Tokenizer::from_json(tiny_tokenizer_json(false), config);
  auto b = Tokenizer::from_json(tiny_tokenizer_json(true), config);
  const std::string text = "abc ab abcd a<eos>cab";
  EXPECT_EQ(a->encode(text), (std::vector<int32_t>{257, ' ', 256, ' ', 257, 'd', 258, 300, 'c', 256}));
  EXPECT_EQ(a->encode(text), b->encode(text));
  EXPECT_EQ(a->decode(a->encode(text)), text);
  EXPECT_EQ(a->eos_id(), 300);
  EXPECT_EQ(a->bos_id(), 300);
  EXPECT_EQ(a->vocab_size(), 301);
}

TEST(Tokenizer, LoadErrorsNameTheFile) {
  try {
    Tokenizer::load("/nonexistent/dir");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos);
  }
  nlohmann::json bad = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", nlohmann::json::array()}}}};
  EXPECT_THROW(Tokenizer::from_json(bad, nullptr, "x/tokenizer.json"), Error);  // no byte tokens
}

}  // namespace
}  // namespace dsinfer
