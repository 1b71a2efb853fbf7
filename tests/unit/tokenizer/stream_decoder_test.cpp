#include "tokenizer/stream_decoder.h"

#include <random>

#include <gtest/gtest.h>

#include "test_data.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace dsinfer {
namespace {

bool is_valid_utf8(const std::string& s) { return tok::utf8_valid_prefix_length(s) == s.size(); }

TEST(StreamDecoder, HoldsPartialCharacterUntilComplete) {
  const Tokenizer& t = testing::deepseek_v3_tokenizer();
  // "你" is E4 BD A0; feed it one byte token at a time.
  const auto b1 = t.encode("\xE4"), b2 = t.encode("\xBD"), b3 = t.encode("\xA0");
  ASSERT_EQ(b1.size() + b2.size() + b3.size(), 3u);
  StreamDecoder d(t);
  EXPECT_EQ(d.push(b1[0]), "");
  EXPECT_EQ(d.num_pending_bytes(), 1u);
  EXPECT_EQ(d.push(b2[0]), "");
  EXPECT_EQ(d.push(b3[0]), "你");
  EXPECT_EQ(d.finish(), "");
}

TEST(StreamDecoder, BrokenBytesBecomeReplacementAtTheEndOnly) {
  const Tokenizer& t = testing::deepseek_v3_tokenizer();
  const auto lead = t.encode("\xE4")[0];
  StreamDecoder d(t);
  EXPECT_EQ(d.push(lead), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
  // A lead byte followed by ASCII can never complete: replaced as soon as that is known.
  StreamDecoder d2(t);
  EXPECT_EQ(d2.push(lead), "");
  EXPECT_EQ(d2.push(t.encode("A")[0]), "\xEF\xBF\xBD" "A");
}

TEST(StreamDecoder, SpecialTokensSkippedOrKept) {
  const Tokenizer& t = testing::deepseek_v3_tokenizer();
  StreamDecoder skip(t, true), keep(t, false);
  EXPECT_EQ(skip.push(1), "");
  EXPECT_EQ(keep.push(1), "<｜end▁of▁sentence｜>");
  EXPECT_EQ(skip.push(128803), "<｜User｜>");  // added but not special: always kept
}

TEST(StreamDecoder, ConcatenationEqualsWholeDecode) {
  const Tokenizer& t = testing::deepseek_v3_tokenizer();
  std::mt19937 rng(11);
  // Byte tokens of multibyte characters, whole-character tokens, specials and unknown ids.
  std::vector<int32_t> pool;
  for (const char* s : {"你好", "👩🏽‍💻", "é", "ok", " the", "\n", "한국어", "ก"}) {
    for (int32_t id : t.encode(s)) pool.push_back(id);
  }
  for (int b = 0x80; b < 0x100; b += 7) pool.push_back(t.encode(std::string(1, static_cast<char>(b)))[0]);
  pool.push_back(0);
  pool.push_back(1);
  pool.push_back(128803);
  pool.push_back(-1);
  for (int iter = 0; iter < 500; ++iter) {
    std::vector<int32_t> ids;
    const int n = 1 + static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) ids.push_back(pool[rng() % pool.size()]);
    for (bool skip : {true, false}) {
      StreamDecoder d(t, skip);
      std::string all;
      for (int32_t id : ids) {
        const std::string piece = d.push(id);
        ASSERT_TRUE(is_valid_utf8(piece));
        all += piece;
      }
      all += d.finish();
      ASSERT_EQ(all, t.decode(ids, skip));
    }
  }
}

}  // namespace
}  // namespace dsinfer
