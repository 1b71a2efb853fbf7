#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace dsinfer::tok {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8, ValidPrefix) {
  const std::string ascii = "plain ascii text, long enough for the fast path";
  EXPECT_EQ(utf8_valid_prefix_length(ascii), ascii.size());
  EXPECT_EQ(utf8_valid_prefix_length(ascii + "\xFF" + ascii), ascii.size());
  EXPECT_EQ(utf8_valid_prefix_length("é你👍"), 2u + 3u + 4u);
  EXPECT_EQ(utf8_valid_prefix_length("ab\xC0\x80"), 2u);        // overlong
  EXPECT_EQ(utf8_valid_prefix_length("ab\xED\xA0\x80"), 2u);    // surrogate
  EXPECT_EQ(utf8_valid_prefix_length("ab\xF4\x90\x80\x80"), 2u);  // above U+10FFFF
  EXPECT_EQ(utf8_valid_prefix_length("ab\xE4\xBD"), 2u);        // truncated
}

TEST(Utf8, IncompleteTail) {
  EXPECT_EQ(utf8_incomplete_tail_length("a\xE4"), 1u);
  EXPECT_EQ(utf8_incomplete_tail_length("a\xE4\xBD"), 2u);
  EXPECT_EQ(utf8_incomplete_tail_length("a\xE4\xBD\xA0"), 0u);  // complete
  EXPECT_EQ(utf8_incomplete_tail_length("a\xF0\x9F\x91"), 3u);
  EXPECT_EQ(utf8_incomplete_tail_length("a\xE0\x80"), 0u);      // can never complete
  EXPECT_EQ(utf8_incomplete_tail_length("a\xBD"), 0u);          // stray continuation
  EXPECT_EQ(utf8_incomplete_tail_length(""), 0u);
}

TEST(Utf8, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(utf8_lossy("ok"), "ok");
  // One U+FFFD per maximal ill-formed subpart, as Python's and JavaScript's decoders do.
  EXPECT_EQ(utf8_lossy("a\xE4\xBD" "b"), "a" + kFffd + "b");
  EXPECT_EQ(utf8_lossy("a\xFF\xFE" "b"), "a" + kFffd + kFffd + "b");
  EXPECT_EQ(utf8_lossy("\xE0\x80\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x91"), kFffd);
}

TEST(Utf8, EncodeDecodeRoundTrip) {
  for (uint32_t cp : {0x41u, 0xE9u, 0x4F60u, 0x1F44Du, 0x10FFFFu}) {
    std::string s;
    append_utf8(cp, s);
    size_t i = 0;
    EXPECT_EQ(decode_utf8(s, &i), cp);
    EXPECT_EQ(i, s.size());
    EXPECT_EQ(utf8_valid_sequence_length(s), s.size());
  }
}

}  // namespace
}  // namespace dsinfer::tok
