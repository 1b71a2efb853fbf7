#include "codec/delimiter_matcher.h"

#include <gtest/gtest.h>

namespace dsinfer::codec {
namespace {

// Feeds text; returns (end position, delimiter index) of each match, resetting after one.
std::vector<std::pair<size_t, int>> matches(DelimiterMatcher& m, const std::string& text) {
  std::vector<std::pair<size_t, int>> out;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto step = m.push(static_cast<uint8_t>(text[i]));
    if (step.matched >= 0) {
      out.emplace_back(i + 1, step.matched);
      m.reset();
    }
  }
  return out;
}

TEST(DelimiterMatcher, FindsDelimitersAcrossFailedPartials) {
  DelimiterMatcher m({"abcd", "bce", "<|x|>"});
  EXPECT_EQ(matches(m, "abce"), (std::vector<std::pair<size_t, int>>{{4, 1}}));
  EXPECT_EQ(matches(m, "<|<|x|>"), (std::vector<std::pair<size_t, int>>{{7, 2}}));
  EXPECT_EQ(matches(m, "aabcd"), (std::vector<std::pair<size_t, int>>{{5, 0}}));
}

TEST(DelimiterMatcher, LongestOfDelimitersEndingTogetherWins) {
  DelimiterMatcher m({"<end>", "\n```<end>"});
  EXPECT_EQ(matches(m, "x\n```<end>"), (std::vector<std::pair<size_t, int>>{{10, 1}}));
  EXPECT_EQ(matches(m, "x```<end>"), (std::vector<std::pair<size_t, int>>{{9, 0}}));
}

TEST(DelimiterMatcher, HeldBytesAreTheLongestDelimiterPrefix) {
  DelimiterMatcher m({"STOP"});
  EXPECT_EQ(m.push('S').num_held_bytes, 1u);
  EXPECT_EQ(m.push('T').num_held_bytes, 2u);
  EXPECT_EQ(m.push('S').num_held_bytes, 1u);  // "STS": only the last S can still start "STOP"
  EXPECT_EQ(m.push('x').num_held_bytes, 0u);
}

}  // namespace
}  // namespace dsinfer::codec
