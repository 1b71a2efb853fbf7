#include "codec/output_parser.h"

#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace dsinfer::codec {
namespace {

using K = OutputEventKind;

OutputEvent ev(K kind, std::string text = "", int tool_index = 0) { return OutputEvent{kind, std::move(text), tool_index}; }

// Joins adjacent text events of one kind (and call): the stream's meaning, independent of
// how the input was cut.
std::vector<OutputEvent> merged(const std::vector<OutputEvent>& events) {
  std::vector<OutputEvent> out;
  for (const auto& e : events) {
    const bool text_kind = e.kind == K::kContent || e.kind == K::kReasoning || e.kind == K::kToolCallArgs;
    if (text_kind && !out.empty() && out.back().kind == e.kind && out.back().tool_index == e.tool_index) {
      out.back().text += e.text;
    } else {
      out.push_back(e);
    }
  }
  return out;
}

std::vector<OutputEvent> parse_in_pieces(const OutputParserOptions& o, const std::vector<std::string>& pieces) {
  OutputParser p(o);
  std::vector<OutputEvent> all;
  for (const auto& piece : pieces) {
    auto ev = p.feed(piece);
    all.insert(all.end(), ev.begin(), ev.end());
  }
  auto ev = p.finish();
  all.insert(all.end(), ev.begin(), ev.end());
  return all;
}

std::vector<OutputEvent> parse_whole(const OutputParserOptions& o, const std::string& text) {
  return merged(parse_in_pieces(o, {text}));
}

std::string dump(const std::vector<OutputEvent>& events) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& e : events) j.push_back({static_cast<int>(e.kind), e.text, e.tool_index});
  return j.dump();
}

OutputParserOptions opts(TemplateFamily f, bool reasoning = false, std::vector<std::string> stops = {}) {
  OutputParserOptions o;
  o.family = f;
  o.starts_in_reasoning = reasoning;
  o.parse_tool_calls = true;
  o.stop_strings = std::move(stops);
  return o;
}

const std::string kV3Calls =
    "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n"
    "{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
const std::string kV31Calls =
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"東京\"}<｜tool▁call▁end｜>"
    "<｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"q\": \"a<b\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

TEST(OutputParser, ContentOnly) {
  EXPECT_EQ(dump(parse_whole(opts(TemplateFamily::kV3), "Hello, world")), dump({ev(K::kContent, "Hello, world")}));
}

TEST(OutputParser, ReasoningFromThePromptsOpenThink) {
  const auto got = parse_whole(opts(TemplateFamily::kR1, true), "step 1\nstep 2\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(dump(got), dump({ev(K::kReasoning, "step 1\nstep 2\n"), ev(K::kContent, "\n\nThe answer is 4.")}));
}

TEST(OutputParser, ThinkTagAtTheStartOpensReasoningLaterItIsText) {
  EXPECT_EQ(dump(parse_whole(opts(TemplateFamily::kR1), "<think>hmm</think>ok <think> is a tag")),
            dump({ev(K::kReasoning, "hmm"), ev(K::kContent, "ok <think> is a tag")}));
}

TEST(OutputParser, V3ToolCalls) {
  const auto got = parse_whole(opts(TemplateFamily::kV3), kV3Calls);
  EXPECT_EQ(dump(got), dump({ev(K::kContent, "Let me check."), ev(K::kToolCallBegin, "get_weather", 0),
                             ev(K::kToolCallArgs, "{\"city\": \"Paris\"}", 0), ev(K::kToolCallEnd, "", 0),
                             ev(K::kToolCallBegin, "calc", 1), ev(K::kToolCallArgs, "{}", 1), ev(K::kToolCallEnd, "", 1)}));
}

TEST(OutputParser, V31ToolCalls) {
  const auto got = parse_whole(opts(TemplateFamily::kV31), kV31Calls);
  EXPECT_EQ(dump(got), dump({ev(K::kToolCallBegin, "get_weather", 0), ev(K::kToolCallArgs, "{\"city\": \"東京\"}", 0),
                             ev(K::kToolCallEnd, "", 0), ev(K::kToolCallBegin, "search", 1),
                             ev(K::kToolCallArgs, "{\"q\": \"a<b\"}", 1), ev(K::kToolCallEnd, "", 1)}));
}

TEST(OutputParser, ToolCallsLeftAloneWhenNotParsed) {
  auto o = opts(TemplateFamily::kV31);
  o.parse_tool_calls = false;
  EXPECT_EQ(dump(parse_whole(o, kV31Calls)), dump({ev(K::kContent, kV31Calls)}));
}

TEST(OutputParser, StopStringEndsTheOutput) {
  EXPECT_EQ(dump(parse_whole(opts(TemplateFamily::kV3, false, {"STOP", "\n\n"}), "Hello STOP more\n\n")),
            dump({ev(K::kContent, "Hello "), ev(K::kStop, "STOP")}));
  EXPECT_EQ(dump(parse_whole(opts(TemplateFamily::kR1, true, {"END"}), "thinking END x")),
            dump({ev(K::kReasoning, "thinking "), ev(K::kStop, "END")}));
}

TEST(OutputParser, HoldsBackOnlyAPartialDelimiter) {
  OutputParser p(opts(TemplateFamily::kV3, false, {"STOP"}));
  EXPECT_EQ(dump(p.feed("abc<｜tool")), dump({ev(K::kContent, "abc")}));
  EXPECT_EQ(dump(p.feed("x")), dump({ev(K::kContent, "<｜toolx")}));
  EXPECT_EQ(dump(p.feed("ST")), dump({}));
  EXPECT_EQ(dump(p.feed("OMP")), dump({ev(K::kContent, "STOMP")}));
  EXPECT_EQ(dump(p.feed("no delimiter prefix here.")), dump({ev(K::kContent, "no delimiter prefix here.")}));
  EXPECT_EQ(dump(p.feed("S")), dump({}));
  EXPECT_EQ(dump(p.finish()), dump({ev(K::kContent, "S")}));
}

TEST(OutputParser, ArgumentsStreamAsTheyArrive) {
  OutputParser p(opts(TemplateFamily::kV31));
  auto e1 = p.feed("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": ");
  EXPECT_EQ(dump(e1), dump({ev(K::kToolCallBegin, "f", 0), ev(K::kToolCallArgs, "{\"a\": ", 0)}));
  auto e2 = p.feed("1}");
  EXPECT_EQ(dump(e2), dump({ev(K::kToolCallArgs, "1}", 0)}));
}

TEST(OutputParser, UnterminatedCallIsClosedAtFinish) {
  const auto got = parse_whole(opts(TemplateFamily::kV3), "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\":");
  EXPECT_EQ(dump(got), dump({ev(K::kToolCallBegin, "f", 0), ev(K::kToolCallArgs, "{\"a\":", 0), ev(K::kToolCallEnd, "", 0)}));
}

// Outputs that exercise every state, plus random mixes of delimiters, their prefixes,
// multibyte text and noise.
std::vector<std::pair<OutputParserOptions, std::string>> property_cases() {
  std::vector<std::pair<OutputParserOptions, std::string>> cases = {
      {opts(TemplateFamily::kV3), kV3Calls},
      {opts(TemplateFamily::kV31), "Sure." + kV31Calls + " done"},
      {opts(TemplateFamily::kR1, true), "思考中…\n</think>\n\nAnswer" + kV3Calls},
      {opts(TemplateFamily::kV31, true, {"<stop>", "ab"}), "reason </thin </think>text a<stop b ab after"},
      {opts(TemplateFamily::kV3, false, {"\n\n"}), "<think>x</think>y\n z\n\nq"},
  };
  const std::vector<std::string> atoms = {"<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                                          "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "function",
                                          "\n```json\n", "\n```", "```", "{\"k\": [1, \"v\"]}", "name", "<", "<｜", "</",
                                          "<｜tool", "</th", "\n", " ", "你好", "👩🏽‍💻", "STOP", "ST", "x", "é"};
  std::mt19937 rng(99);
  for (int i = 0; i < 150; ++i) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 25);
    for (int k = 0; k < n; ++k) s += atoms[rng() % atoms.size()];
    const auto family = static_cast<TemplateFamily>(rng() % 3);
    auto o = opts(family, rng() % 2 == 0, rng() % 2 ? std::vector<std::string>{"STOP"} : std::vector<std::string>{});
    o.parse_tool_calls = rng() % 4 != 0;
    cases.push_back({o, s});
  }
  return cases;
}

TEST(OutputParserProperty, SameEventsHoweverTheOutputIsCut) {
  for (const auto& [o, text] : property_cases()) {
    const auto whole = parse_whole(o, text);
    // Every split into two pieces.
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      const auto got = merged(parse_in_pieces(o, {text.substr(0, cut), text.substr(cut)}));
      ASSERT_EQ(dump(got), dump(whole)) << "cut at " << cut << " of " << nlohmann::json(text).dump();
    }
    // One byte at a time, and one character at a time.
    std::vector<std::string> bytes, chars;
    for (char c : text) bytes.emplace_back(1, c);
    for (size_t i = 0; i < text.size();) {
      size_t len = 1;
      const auto b = static_cast<unsigned char>(text[i]);
      if (b >= 0xF0) len = 4; else if (b >= 0xE0) len = 3; else if (b >= 0xC0) len = 2;
      chars.push_back(text.substr(i, len));
      i += len;
    }
    ASSERT_EQ(dump(merged(parse_in_pieces(o, bytes))), dump(whole)) << nlohmann::json(text).dump();
    ASSERT_EQ(dump(merged(parse_in_pieces(o, chars))), dump(whole)) << nlohmann::json(text).dump();
  }
}

TEST(OutputParserProperty, ArgumentFragmentsConcatenateToTheArgumentsJson) {
  OutputParser p(opts(TemplateFamily::kV3));
  std::string args;
  int begins = 0;
  for (char c : kV3Calls) {
    for (const auto& e : p.feed(std::string(1, c))) {
      if (e.kind == K::kToolCallArgs && e.tool_index == 0) args += e.text;
      if (e.kind == K::kToolCallBegin) ++begins;
    }
  }
  p.finish();
  EXPECT_EQ(begins, 2);
  EXPECT_EQ(nlohmann::json::parse(args), nlohmann::json({{"city", "Paris"}}));
}

}  // namespace
}  // namespace dsinfer::codec
