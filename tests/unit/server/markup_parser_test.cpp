#include <gtest/gtest.h>

#include "server/byte_codec.h"

namespace dsinfer::server {
namespace {

using codec::OutputEvent;
using codec::OutputEventKind;

// Feeds `text` in pieces of `piece` bytes and merges adjacent text events of one kind.
std::vector<OutputEvent> parse(const std::string& text, size_t piece, ParserOptions options = {}) {
  auto parser = make_markup_parser(options);
  std::vector<OutputEvent> raw;
  for (size_t i = 0; i < text.size(); i += piece) parser->push(text.substr(i, piece), raw);
  parser->finish(raw);
  std::vector<OutputEvent> merged;
  for (auto& e : raw) {
    bool text_kind = e.kind == OutputEventKind::kContent || e.kind == OutputEventKind::kReasoning ||
                     e.kind == OutputEventKind::kToolCallArgs;
    if (text_kind && !merged.empty() && merged.back().kind == e.kind && merged.back().tool_index == e.tool_index) {
      merged.back().text += e.text;
    } else {
      merged.push_back(e);
    }
  }
  return merged;
}

TEST(MarkupParser, ReasoningThenContentWhateverThePieceSize) {
  for (size_t piece : {1, 2, 3, 7, 100}) {
    auto events = parse("<think>plan</think>answer", piece);
    ASSERT_EQ(events.size(), 2u) << piece;
    EXPECT_EQ(events[0], (OutputEvent{OutputEventKind::kReasoning, "plan", 0}));
    EXPECT_EQ(events[1], (OutputEvent{OutputEventKind::kContent, "answer", 0}));
  }
}

TEST(MarkupParser, ToolCallsAreNumberedAndCarryTheirArguments) {
  for (size_t piece : {1, 4, 100}) {
    auto events = parse("ok<tool_call>get\n{\"a\":1}</tool_call><tool_call>put\n{}</tool_call>", piece);
    ASSERT_EQ(events.size(), 7u) << piece;
    EXPECT_EQ(events[0], (OutputEvent{OutputEventKind::kContent, "ok", 0}));
    EXPECT_EQ(events[1], (OutputEvent{OutputEventKind::kToolCallBegin, "get", 0}));
    EXPECT_EQ(events[2], (OutputEvent{OutputEventKind::kToolCallArgs, "{\"a\":1}", 0}));
    EXPECT_EQ(events[3], (OutputEvent{OutputEventKind::kToolCallEnd, "", 0}));
    EXPECT_EQ(events[4], (OutputEvent{OutputEventKind::kToolCallBegin, "put", 1}));
    EXPECT_EQ(events[6], (OutputEvent{OutputEventKind::kToolCallEnd, "", 1}));
  }
}

TEST(MarkupParser, ToolSyntaxIsContentWhenToolsAreOff) {
  ParserOptions options;
  options.parse_tool_calls = false;
  auto events = parse("<tool_call>x\n{}</tool_call>", 3, options);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, OutputEventKind::kContent);
  EXPECT_EQ(events[0].text, "<tool_call>x\n{}</tool_call>");
}

TEST(MarkupParser, StopStringEndsOutputAndIsNotReturned) {
  ParserOptions options;
  options.stop_strings = {"STOP", "xyz"};
  for (size_t piece : {1, 2, 5}) {
    auto events = parse("abc ST STOP def", piece, options);
    ASSERT_EQ(events.size(), 2u) << piece;
    EXPECT_EQ(events[0], (OutputEvent{OutputEventKind::kContent, "abc ST ", 0}));
    EXPECT_EQ(events[1], (OutputEvent{OutputEventKind::kStop, "STOP", 0}));
  }
}

TEST(MarkupParser, HeldBackPrefixIsReleasedAtTheEnd) {
  ParserOptions options;
  options.stop_strings = {"STOP"};
  auto events = parse("abc STO", 1, options);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text, "abc STO");
}

TEST(MarkupParser, UnterminatedToolCallIsClosed) {
  auto events = parse("<tool_call>f\n{\"x\":", 2);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[2].kind, OutputEventKind::kToolCallEnd);
}

TEST(ByteCodec, TextStreamHoldsBackSplitUtf8) {
  ByteCodec codec;
  auto stream = codec.make_text_stream();
  std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(stream->push(static_cast<unsigned char>(euro[0])), "");
  EXPECT_EQ(stream->push(static_cast<unsigned char>(euro[1])), "");
  EXPECT_EQ(stream->push(static_cast<unsigned char>(euro[2])), euro);
  EXPECT_EQ(stream->push(ByteCodec::kEosId), "");
}

TEST(ByteCodec, PromptEndsWithTheLastMessageBetweenMarkers) {
  ByteCodec codec;
  codec::Conversation conversation;
  conversation.messages.push_back({codec::Role::kUser, "hi", std::nullopt, {}, ""});
  auto ids = codec.encode_conversation(conversation, {});
  ASSERT_TRUE(ids.ok());
  const auto& v = ids.value().ids;
  ASSERT_GE(v.size(), 4u);
  EXPECT_EQ(v[v.size() - 4], ByteCodec::kReplyBegin);
  EXPECT_EQ(v[v.size() - 3], 'h');
  EXPECT_EQ(v.back(), ByteCodec::kReplyEnd);
}

}  // namespace
}  // namespace dsinfer::server
