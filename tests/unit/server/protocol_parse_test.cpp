#include <gtest/gtest.h>

#include <algorithm>

#include "codec/anthropic_messages_protocol.h"
#include "codec/openai_chat_protocol.h"
#include "codec/openai_responses_protocol.h"

namespace dsinfer::codec {
namespace {

TEST(ChatCompletionsParse, ReadsMessagesToolsAndSampling) {
  auto r = parse_chat_completions_request(R"({
    "model": "m", "n": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7,
    "max_tokens": 10, "max_completion_tokens": 20, "stop": ["x", "yy"], "stream": true,
    "stream_options": {"include_usage": true}, "thinking": {"type": "enabled"},
    "response_format": {"type": "json_object"},
    "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": "{\"q\":1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}}})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ApiRequest& q = r.value();
  EXPECT_EQ(q.model, "m");
  EXPECT_EQ(q.n, 2);
  EXPECT_FLOAT_EQ(q.sampling.temperature, 0.5f);
  EXPECT_EQ(q.sampling.top_k, 40);
  EXPECT_EQ(q.sampling.seed, 7u);
  EXPECT_EQ(q.sampling.max_tokens, 20);  // max_completion_tokens wins
  EXPECT_TRUE(q.max_tokens_given);
  EXPECT_EQ(q.stop, (std::vector<std::string>{"x", "yy"}));
  EXPECT_TRUE(q.stream && q.include_usage && q.json_object);
  EXPECT_EQ(q.thinking, true);
  ASSERT_EQ(q.conversation.messages.size(), 4u);
  EXPECT_EQ(q.conversation.messages[0].role, Role::kSystem);
  EXPECT_EQ(q.conversation.messages[1].content, "ab");
  ASSERT_EQ(q.conversation.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(q.conversation.messages[2].tool_calls[0].arguments_json, "{\"q\":1}");
  EXPECT_EQ(q.conversation.messages[3].tool_call_id, "c1");
  EXPECT_EQ(q.tool_choice.mode, ToolChoiceMode::kNamed);
  EXPECT_EQ(q.conversation.tools[0].parameters_json, R"({"type":"object"})");
}

struct BadCase {
  const char* body;
  const char* param;
};

TEST(ChatCompletionsParse, RejectsBadInputNamingTheParameter) {
  const BadCase cases[] = {
      {R"({"model":"m","messages":[]})", "messages"},
      {R"({"model":"m"})", "messages"},
      {R"({"messages":[{"role":"user","content":"x"}]})", "model"},
      {R"({"model":"m","messages":[{"role":"wizard","content":"x"}]})", "messages[0].role"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":3})", "temperature"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-5})", "max_tokens"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", "max_tokens"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":0})", "n"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_p":0})", "top_p"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":[1]})", "stop[0]"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"nope"}},"tools":[{"type":"function","function":{"name":"f"}}]})", "tool_choice"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice"},
      {R"({"model":"m","messages":[{"role":"tool","content":"x"}]})", "messages[0].tool_call_id"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})", "messages[0].content[0].type"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"})", "stream"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":1})", "logprobs"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"presence_penalty":2.5})", "presence_penalty"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"frequency_penalty":"high"})", "frequency_penalty"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"repetition_penalty":0})", "repetition_penalty"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":[1]})", "logit_bias"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"x7":1}})", "logit_bias"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"-7":1}})", "logit_bias"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"7":101}})", "logit_bias.7"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"7":"up"}})", "logit_bias.7"},
  };
  for (const auto& c : cases) {
    std::string param = "unset";
    auto r = parse_chat_completions_request(c.body, &param);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(param, c.param) << c.body << " → " << r.status().message();
  }
}

TEST(ChatCompletionsParse, RejectsMalformedJsonInvalidUtf8AndDeepNesting) {
  std::string deep = R"({"model":"m","messages":[{"role":"user","content":"x"}],"x":)" + std::string(1000, '[') + std::string(1000, ']') + "}";
  for (std::string body : {std::string("{"), std::string("[1,2]"), std::string(""), std::string("{\"model\":\"\xff\"}"), deep}) {
    auto r = parse_chat_completions_request(body);
    EXPECT_FALSE(r.ok()) << body.substr(0, 40);
  }
}

TEST(CompletionsParse, AcceptsTextOrTokenIdsAndDefaultsTo16Tokens) {
  auto text = parse_completions_request(R"({"model":"m","prompt":"hello"})");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->prompt_text, "hello");
  EXPECT_EQ(text->sampling.max_tokens, 16);
  auto ids = parse_completions_request(R"({"model":"m","prompt":[1,2,3],"max_tokens":4})");
  ASSERT_TRUE(ids.ok());
  EXPECT_TRUE(ids->has_prompt_ids);
  EXPECT_EQ(ids->prompt_ids, (std::vector<TokenId>{1, 2, 3}));
  EXPECT_FALSE(parse_completions_request(R"({"model":"m","prompt":[1,-2]})").ok());
  EXPECT_FALSE(parse_completions_request(R"({"model":"m","prompt":["a","b"]})").ok());
}

TEST(ChatCompletionsParse, LogprobsAskForEachTokensOwnAndTheTopOnes) {
  auto off = parse_chat_completions_request(R"({"model":"m","messages":[{"role":"user","content":"x"}]})");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->sampling.wants_logprobs());
  auto own =
      parse_chat_completions_request(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true})");
  ASSERT_TRUE(own.ok());
  EXPECT_TRUE(own->sampling.logprobs);
  EXPECT_EQ(own->sampling.num_logprobs, 0);
  auto top = parse_chat_completions_request(
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":20})");
  ASSERT_TRUE(top.ok());
  EXPECT_EQ(top->sampling.num_logprobs, 20);
}

TEST(ChatCompletionsParse, ReadsThePenalties) {
  auto r = parse_chat_completions_request(
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"presence_penalty":0.5,"frequency_penalty":-1,)"
      R"("repetition_penalty":1.2})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FLOAT_EQ(r->sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r->sampling.frequency_penalty, -1.0f);
  EXPECT_FLOAT_EQ(r->sampling.repetition_penalty, 1.2f);
  EXPECT_TRUE(r->sampling.penalised());
  auto none = parse_completions_request(R"({"model":"m","prompt":"a","presence_penalty":0,"repetition_penalty":1})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->sampling.changes_logits());
  auto bias = parse_completions_request(R"({"model":"m","prompt":"a","logit_bias":{"50256":-100,"7":2.5}})");
  ASSERT_TRUE(bias.ok()) << bias.status().message();
  EXPECT_FALSE(bias->sampling.penalised());  // a bias needs no history
  EXPECT_TRUE(bias->sampling.changes_logits());
  auto sorted = bias->sampling.logit_bias;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<std::pair<TokenId, float>>{{7, 2.5f}, {50256, -100.0f}}));
}

TEST(CompletionsParse, LogprobsCountTheAlternativesAndRefuseEcho) {
  auto zero = parse_completions_request(R"({"model":"m","prompt":"a","logprobs":0})");
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(zero->sampling.logprobs);
  EXPECT_EQ(zero->sampling.num_logprobs, 0);
  auto five = parse_completions_request(R"({"model":"m","prompt":"a","logprobs":5})");
  ASSERT_TRUE(five.ok());
  EXPECT_EQ(five->sampling.num_logprobs, 5);
  auto null = parse_completions_request(R"({"model":"m","prompt":"a","logprobs":null})");
  ASSERT_TRUE(null.ok());
  EXPECT_FALSE(null->sampling.wants_logprobs());
  for (const char* body : {R"({"model":"m","prompt":"a","logprobs":true})",
                           R"({"model":"m","prompt":"a","logprobs":21})",
                           R"({"model":"m","prompt":"a","logprobs":1,"echo":true})"}) {
    std::string param;
    auto r = parse_completions_request(body, &param);
    EXPECT_FALSE(r.ok()) << body;
    EXPECT_EQ(param, "logprobs") << body;
  }
}

TEST(ResponsesParse, IncludeAsksForOutputTextLogprobs) {
  auto r = parse_responses_request(
      R"({"model":"m","input":"x","include":["reasoning.encrypted_content","message.output_text.logprobs"],)"
      R"("top_logprobs":3})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->sampling.logprobs);
  EXPECT_EQ(r->sampling.num_logprobs, 3);
  auto other = parse_responses_request(R"({"model":"m","input":"x","include":["reasoning.encrypted_content"]})");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->sampling.wants_logprobs());
  for (auto [body, param] :
       {std::pair{R"({"model":"m","input":"x","include":"message.output_text.logprobs"})", "include"},
        std::pair{R"({"model":"m","input":"x","include":[1]})", "include[0]"},
        std::pair{R"({"model":"m","input":"x","top_logprobs":21})", "top_logprobs"}}) {
    std::string got;
    EXPECT_FALSE(parse_responses_request(body, &got).ok()) << body;
    EXPECT_EQ(got, param) << body;
  }
}

TEST(ResponsesParse, ReadsItemsInstructionsAndFunctionCalls) {
  auto r = parse_responses_request(R"({"model":"m","instructions":"sys","max_output_tokens":9,
    "input":[{"role":"user","content":[{"type":"input_text","text":"q"}]},
             {"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
             {"type":"function_call_output","call_id":"c","output":"out"}],
    "tools":[{"type":"function","name":"f","parameters":{}}],"tool_choice":"required",
    "reasoning":{"effort":"high"}})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto& m = r->conversation.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].role, Role::kSystem);
  EXPECT_EQ(m[2].role, Role::kAssistant);
  EXPECT_EQ(m[2].tool_calls[0].name, "f");
  EXPECT_EQ(m[3].role, Role::kTool);
  EXPECT_EQ(r->sampling.max_tokens, 9);
  EXPECT_EQ(r->tool_choice.mode, ToolChoiceMode::kRequired);
  EXPECT_EQ(r->thinking, true);
  std::string param;
  EXPECT_FALSE(parse_responses_request(R"({"model":"m","input":[]})", &param).ok());
  EXPECT_EQ(param, "input");
  EXPECT_FALSE(parse_responses_request(R"({"model":"m","input":"x","tools":[{"type":"web_search"}]})", &param).ok());
  EXPECT_EQ(param, "tools[0].type");
}

TEST(MessagesParse, ReadsBlocksAndRequiresMaxTokens) {
  auto r = parse_messages_request(R"({"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],
    "messages":[{"role":"user","content":"q"},
                {"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":""},
                  {"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},
                {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r"}]}],
    "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"},
    "stop_sequences":["END"],"thinking":{"type":"enabled","budget_tokens":100}})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto& m = r->conversation.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].content, "s");
  EXPECT_EQ(m[2].reasoning_content, "t");
  EXPECT_EQ(m[2].tool_calls[0].arguments_json, R"({"a":1})");
  EXPECT_EQ(m[3].role, Role::kTool);
  EXPECT_EQ(r->tool_choice.mode, ToolChoiceMode::kRequired);
  EXPECT_EQ(r->stop, std::vector<std::string>{"END"});
  std::string param;
  EXPECT_FALSE(parse_messages_request(R"({"model":"m","messages":[{"role":"user","content":"q"}]})", &param).ok());
  EXPECT_EQ(param, "max_tokens");
  EXPECT_FALSE(parse_messages_request(R"({"model":"m","max_tokens":1,"messages":[{"role":"system","content":"q"}]})", &param).ok());
  EXPECT_EQ(param, "messages.0.role");
  EXPECT_FALSE(parse_messages_request(R"({"model":"m","max_tokens":1,"temperature":1.5,"messages":[{"role":"user","content":"q"}]})", &param).ok());
  EXPECT_EQ(param, "temperature");
}

TEST(ErrorBody, EachProtocolHasItsShape) {
  ApiError e{400, "context_length_exceeded", "messages", "too long"};
  EXPECT_EQ(error_body(ApiProtocol::kChatCompletions, e),
            R"({"error":{"code":"context_length_exceeded","message":"too long","param":"messages","type":"invalid_request_error"}})");
  EXPECT_EQ(error_body(ApiProtocol::kMessages, e), R"({"error":{"message":"too long","type":"invalid_request_error"},"type":"error"})");
}

}  // namespace
}  // namespace dsinfer::codec
