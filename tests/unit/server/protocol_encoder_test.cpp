#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "codec/protocol_encoder.h"

namespace dsinfer::codec {
namespace {

using nlohmann::json;

struct Frame {
  std::string event;
  json data;
};

std::vector<Frame> frames(const std::string& sse) {
  std::vector<Frame> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    size_t end = sse.find("\n\n", pos);
    std::string block = sse.substr(pos, end - pos);
    pos = end + 2;
    Frame f;
    size_t line_start = 0;
    while (line_start < block.size()) {
      size_t nl = block.find('\n', line_start);
      std::string line = block.substr(line_start, nl == std::string::npos ? std::string::npos : nl - line_start);
      if (line.rfind("event: ", 0) == 0) f.event = line.substr(7);
      if (line.rfind("data: ", 0) == 0) f.data = line.substr(6) == "[DONE]" ? json("[DONE]") : json::parse(line.substr(6));
      if (nl == std::string::npos) break;
      line_start = nl + 1;
    }
    out.push_back(f);
  }
  return out;
}

void play(ProtocolEncoder& e, std::string& out) {
  e.begin(out);
  e.on_event(0, {OutputEventKind::kReasoning, "think", 0}, out);
  e.on_event(0, {OutputEventKind::kContent, "Hi", 0}, out);
  e.on_event(0, {OutputEventKind::kToolCallBegin, "f", 0}, out);
  e.on_event(0, {OutputEventKind::kToolCallArgs, "{\"a\":", 0}, out);
  e.on_event(0, {OutputEventKind::kToolCallArgs, "1}", 0}, out);
  e.on_event(0, {OutputEventKind::kToolCallEnd, "", 0}, out);
  e.end_choice(0, ChoiceEnd::kEndOfTurn, "", out);
  e.end({10, 4, 6, 1}, out);
}

EncoderOptions options(bool stream, const char* id) {
  EncoderOptions o;
  o.response_id = id;
  o.model = "m";
  o.stream = stream;
  o.include_usage = true;
  o.num_prompt_tokens = 10;
  o.num_cached_prompt_tokens = 4;
  return o;
}

TEST(ChatEncoder, StreamsDeltasThenFinishThenUsageThenDone) {
  auto e = make_protocol_encoder(ApiProtocol::kChatCompletions, options(true, "chatcmpl-abc"));
  std::string out;
  play(*e, out);
  auto f = frames(out);
  ASSERT_EQ(f.size(), 9u);
  EXPECT_EQ(f[0].data["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(f[1].data["choices"][0]["delta"]["reasoning_content"], "think");
  EXPECT_EQ(f[2].data["choices"][0]["delta"]["content"], "Hi");
  EXPECT_EQ(f[3].data["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(f[4].data["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"], "{\"a\":");
  EXPECT_EQ(f[6].data["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(f[7].data["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(f[7].data["usage"]["prompt_cache_miss_tokens"], 6);
  EXPECT_EQ(f[8].data, "[DONE]");
}

TEST(ChatEncoder, NonStreamingBodyHasMessageAndUsage) {
  auto e = make_protocol_encoder(ApiProtocol::kChatCompletions, options(false, "chatcmpl-abc"));
  std::string out;
  play(*e, out);
  json body = json::parse(out);
  auto& msg = body["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "Hi");
  EXPECT_EQ(msg["reasoning_content"], "think");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(body["usage"]["completion_tokens_details"]["reasoning_tokens"], 1);
}

EncoderOptions logprobs_options(bool stream, const char* id) {
  EncoderOptions o = options(stream, id);
  o.logprobs = true;
  return o;
}

TokenLogprobs token_logprobs(const std::string& bytes, float logprob, std::vector<LogprobToken> top = {}) {
  return {{bytes, bytes, logprob}, std::move(top)};
}

TEST(ChatEncoder, LogprobsGoWithTheContentTheirTokensMade) {
  auto e = make_protocol_encoder(ApiProtocol::kChatCompletions, logprobs_options(true, "chatcmpl-abc"));
  std::string out;
  e->begin(out);
  e->on_event(0, {OutputEventKind::kReasoning, "r", 0}, out);
  e->on_logprobs(0, {token_logprobs("H", -0.5f, {{"H", "H", -0.5f}, {"\xef\xbf\xbd", "\xe2", -1e30f}}),
                     token_logprobs("i", -0.25f)});
  e->on_event(0, {OutputEventKind::kContent, "Hi", 0}, out);
  e->on_event(0, {OutputEventKind::kContent, "!", 0}, out);
  e->end_choice(0, ChoiceEnd::kLength, "", out);
  e->end({10, 0, 3, 0}, out);
  auto f = frames(out);
  ASSERT_GE(f.size(), 5u);
  EXPECT_TRUE(f[1].data["choices"][0]["logprobs"].is_null());  // reasoning
  const json& lp = f[2].data["choices"][0]["logprobs"];
  EXPECT_EQ(f[2].data["choices"][0]["delta"]["content"], "Hi");
  ASSERT_EQ(lp["content"].size(), 2u);
  EXPECT_EQ(lp["content"][0]["token"], "H");
  EXPECT_EQ(lp["content"][0]["bytes"], json::array({72}));
  EXPECT_EQ(lp["content"][0]["logprob"], -0.5);
  EXPECT_EQ(lp["content"][0]["top_logprobs"][1]["logprob"], -9999.0);  // probability 0
  EXPECT_EQ(lp["content"][1]["top_logprobs"], json::array());
  EXPECT_TRUE(lp["refusal"].is_null());
  EXPECT_TRUE(f[3].data["choices"][0]["logprobs"].is_null());  // no token of its own
}

TEST(ChatEncoder, NonStreamingLogprobsListTheContentTokens) {
  for (bool asked : {false, true}) {
    EncoderOptions o = options(false, "chatcmpl-abc");
    o.logprobs = asked;
    auto e = make_protocol_encoder(ApiProtocol::kChatCompletions, o);
    std::string out;
    e->begin(out);
    e->on_logprobs(0, {token_logprobs("a", -1.0f), token_logprobs("b", -2.0f)});
    e->on_event(0, {OutputEventKind::kContent, "ab", 0}, out);
    e->end_choice(0, ChoiceEnd::kEndOfTurn, "", out);
    e->end({10, 0, 2, 0}, out);
    const json logprobs = json::parse(out)["choices"][0]["logprobs"];
    if (!asked) {
      EXPECT_TRUE(logprobs.is_null());
      continue;
    }
    ASSERT_EQ(logprobs["content"].size(), 2u);
    EXPECT_EQ(logprobs["content"][1]["token"], "b");
    EXPECT_EQ(logprobs["content"][1]["logprob"], -2.0);
  }
}

TEST(CompletionsEncoder, LogprobsListTokensOffsetsAndAlternatives) {
  for (bool stream : {false, true}) {
    auto e = make_protocol_encoder(ApiProtocol::kCompletions, logprobs_options(stream, "cmpl-abc"));
    std::string out;
    e->begin(out);
    e->on_logprobs(0, {token_logprobs("h\xc3\xa9", -1.0f, {{"h\xc3\xa9", "h\xc3\xa9", -1.0f}, {"x", "x", -2.0f}})});
    e->on_event(0, {OutputEventKind::kContent, "h\xc3\xa9", 0}, out);
    e->on_logprobs(0, {token_logprobs("!", -0.5f, {{"!", "!", -0.5f}, {"?", "?", -3.0f}})});
    e->on_event(0, {OutputEventKind::kContent, "!", 0}, out);
    e->end_choice(0, ChoiceEnd::kLength, "", out);
    e->end({10, 0, 2, 0}, out);
    json tokens = json::array(), offsets = json::array(), values = json::array(), top = json::array();
    auto gather = [&](const json& logprobs) {
      for (size_t i = 0; i < logprobs["tokens"].size(); ++i) {
        tokens.push_back(logprobs["tokens"][i]);
        offsets.push_back(logprobs["text_offset"][i]);
        values.push_back(logprobs["token_logprobs"][i]);
        top.push_back(logprobs["top_logprobs"][i]);
      }
    };
    if (stream) {
      for (const Frame& f : frames(out))
        if (f.data.is_object() && !f.data["choices"].empty() && !f.data["choices"][0]["logprobs"].is_null())
          gather(f.data["choices"][0]["logprobs"]);
    } else {
      gather(json::parse(out)["choices"][0]["logprobs"]);
    }
    EXPECT_EQ(tokens, json::array({"h\xc3\xa9", "!"})) << stream;
    EXPECT_EQ(offsets, json::array({0, 2})) << stream;  // characters, not bytes
    EXPECT_EQ(values, json::array({-1.0, -0.5})) << stream;
    EXPECT_EQ(top[1], json({{"!", -0.5}, {"?", -3.0}})) << stream;
  }
}

TEST(ResponsesEncoder, OutputTextCarriesItsTokensLogprobs) {
  for (bool stream : {false, true}) {
    auto e = make_protocol_encoder(ApiProtocol::kResponses, logprobs_options(stream, "resp_abc"));
    std::string out;
    e->begin(out);
    e->on_event(0, {OutputEventKind::kReasoning, "r", 0}, out);
    e->on_logprobs(0, {token_logprobs("H", -0.5f, {{"H", "H", -0.5f}}),
                       token_logprobs("i", -0.25f, {{"i", "i", -0.25f}})});
    e->on_event(0, {OutputEventKind::kContent, "Hi", 0}, out);
    e->on_logprobs(0, {token_logprobs("!", -1.0f, {{"!", "!", -1.0f}})});
    e->on_event(0, {OutputEventKind::kContent, "!", 0}, out);
    e->end_choice(0, ChoiceEnd::kEndOfTurn, "", out);
    e->end({10, 0, 3, 0}, out);
    const json response = stream ? frames(out).back().data["response"] : json::parse(out);
    const json& part = response["output"][1]["content"][0];
    EXPECT_EQ(part["text"], "Hi!");
    ASSERT_EQ(part["logprobs"].size(), 3u) << stream;
    EXPECT_EQ(part["logprobs"][2]["token"], "!");
    EXPECT_EQ(part["logprobs"][2]["top_logprobs"][0]["logprob"], -1.0);
    if (!stream) continue;
    std::vector<size_t> delta_sizes;
    for (const Frame& f : frames(out))
      if (f.event == "response.output_text.delta") delta_sizes.push_back(f.data["logprobs"].size());
    EXPECT_EQ(delta_sizes, (std::vector<size_t>{2, 1}));
  }
}

TEST(ResponsesEncoder, EmitsItemLifecycleWithIncreasingSequenceNumbers) {
  auto e = make_protocol_encoder(ApiProtocol::kResponses, options(true, "resp_abc"));
  std::string out;
  play(*e, out);
  auto f = frames(out);
  std::vector<std::string> types;
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(f[i].data["sequence_number"], i);
    EXPECT_EQ(f[i].event, f[i].data["type"]);
    types.push_back(f[i].event);
  }
  std::vector<std::string> expected = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
  EXPECT_EQ(types, expected);
  auto& done = f.back().data["response"];
  EXPECT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output_text"], "Hi");
  EXPECT_EQ(done["usage"]["input_tokens_details"]["cached_tokens"], 4);
}

TEST(MessagesEncoder, EmitsBlocksAndStopReason) {
  auto e = make_protocol_encoder(ApiProtocol::kMessages, options(true, "msg_abc"));
  std::string out;
  play(*e, out);
  auto f = frames(out);
  std::vector<std::string> types;
  for (auto& fr : f) types.push_back(fr.event);
  std::vector<std::string> expected = {"message_start", "content_block_start", "content_block_delta", "content_block_stop",
                                       "content_block_start", "content_block_delta", "content_block_stop",
                                       "content_block_start", "content_block_delta", "content_block_delta",
                                       "content_block_stop", "message_delta", "message_stop"};
  EXPECT_EQ(types, expected);
  EXPECT_EQ(f[0].data["message"]["usage"]["cache_read_input_tokens"], 4);
  EXPECT_EQ(f[1].data["content_block"]["type"], "thinking");
  EXPECT_EQ(f[7].data["content_block"]["type"], "tool_use");
  EXPECT_EQ(f[8].data["delta"]["type"], "input_json_delta");
  EXPECT_EQ(f[11].data["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(f[11].data["usage"]["cache_read_input_tokens"], 4);  // known at the end
  EXPECT_EQ(f[11].data["usage"]["input_tokens"], 6);
}

TEST(MessagesEncoder, NonStreamingStopSequence) {
  auto e = make_protocol_encoder(ApiProtocol::kMessages, options(false, "msg_abc"));
  std::string out;
  e->begin(out);
  e->on_event(0, {OutputEventKind::kContent, "abc", 0}, out);
  e->end_choice(0, ChoiceEnd::kStopString, "END", out);
  e->end({10, 0, 3, 0}, out);
  json body = json::parse(out);
  EXPECT_EQ(body["stop_reason"], "stop_sequence");
  EXPECT_EQ(body["stop_sequence"], "END");
  EXPECT_EQ(body["content"][0]["text"], "abc");
  EXPECT_EQ(body["usage"]["output_tokens"], 3);
}

}  // namespace
}  // namespace dsinfer::codec
