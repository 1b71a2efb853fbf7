#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "fake_exchange.h"
#include "server/api_server.h"
#include "server/byte_codec.h"
#include "server/echo_engine.h"

namespace dsinfer::server {
namespace {

using nlohmann::json;
using testing::FakeExchange;
using testing::TestLoop;

class ApiServerTest : public ::testing::Test {
 protected:
  void make(ApiServerOptions options = {}, EchoEngineOptions engine_options = {}) {
    options.served_model_name = "echo";
    engine_options.step_interval_us = 100;
    engine_options.max_context_tokens = 2048;
    engine_ = std::make_unique<EchoEngine>(engine_options);
    api_ = std::make_unique<ApiServer>(options);
    api_->set_model(engine_.get(), &codec_);
  }
  void SetUp() override { make(); }
  void TearDown() override {
    engine_->shutdown();
    loop_.run_until([] { return true; });
  }

  std::shared_ptr<FakeExchange> send(const std::string& method, const std::string& path, const std::string& body,
                                     std::vector<std::pair<std::string, std::string>> headers = {}, size_t max_write = SIZE_MAX) {
    auto exchange = std::make_shared<FakeExchange>(loop_, max_write);
    HttpRequest request;
    request.method = method;
    request.target = path;
    request.body = body;
    request.headers = std::move(headers);
    api_->handle(std::move(request), exchange);
    return exchange;
  }

  std::shared_ptr<FakeExchange> complete(const std::string& path, const std::string& body) {
    auto exchange = send("POST", path, body);
    EXPECT_TRUE(loop_.run_until([&] { return exchange->complete(); }));
    return exchange;
  }

  static std::string chat(const std::string& content, const std::string& extra = "") {
    return R"({"model":"echo",)" + extra + R"("messages":[{"role":"user","content":)" + json(content).dump() + "}]}";
  }

  TestLoop loop_;
  ByteCodec codec_;
  std::unique_ptr<EchoEngine> engine_;
  std::unique_ptr<ApiServer> api_;
};

TEST_F(ApiServerTest, ChatCompletionAnswersWithParsedReasoningAndContent) {
  auto ex = complete("/v1/chat/completions", chat("<think>r</think>hello"));
  ASSERT_EQ(ex->status(), 200) << ex->body();
  json body = json::parse(ex->body());
  EXPECT_EQ(body["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(body["choices"][0]["message"]["reasoning_content"], "r");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["completion_tokens"], 22);  // 21 bytes + eos
  EXPECT_EQ(api_->num_active_requests(), 0);
}

TEST_F(ApiServerTest, NChoicesAreIndependentRequests) {
  auto ex = complete("/v1/chat/completions", chat("ab", R"("n":3,)"));
  json body = json::parse(ex->body());
  ASSERT_EQ(body["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(body["choices"][i]["message"]["content"], "ab");
  EXPECT_EQ(body["usage"]["completion_tokens"], 9);
}

TEST_F(ApiServerTest, StopStringEndsTheChoiceAndCancelsTheEngineRequest) {
  auto ex = complete("/v1/chat/completions", chat("one two three four", R"("stop":["three"],)"));
  json body = json::parse(ex->body());
  EXPECT_EQ(body["choices"][0]["message"]["content"], "one two ");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  ASSERT_TRUE(loop_.run_until([&] { return engine_->stats().num_running == 0; }));
  EXPECT_EQ(engine_->stats().num_kv_blocks_used, 0);
}

TEST_F(ApiServerTest, MaxTokensGivesLength) {
  auto ex = complete("/v1/messages", R"({"model":"echo","max_tokens":3,"messages":[{"role":"user","content":"abcdef"}]})");
  json body = json::parse(ex->body());
  EXPECT_EQ(body["content"][0]["text"], "abc");
  EXPECT_EQ(body["stop_reason"], "max_tokens");
}

TEST_F(ApiServerTest, ToolCallsAreParsedOnlyWithTools) {
  std::string tools = R"("tools":[{"type":"function","function":{"name":"get","parameters":{"type":"object"}}}],)";
  auto with = complete("/v1/chat/completions", chat("<tool_call>get\n{\"x\":1}</tool_call>", tools));
  json body = json::parse(with->body());
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get");
  auto none = complete("/v1/chat/completions", chat("<tool_call>get\n{}</tool_call>", tools + R"("tool_choice":"none",)"));
  EXPECT_EQ(json::parse(none->body())["choices"][0]["message"]["content"], "<tool_call>get\n{}</tool_call>");
}

TEST_F(ApiServerTest, StreamingWritesSseAndEnds) {
  auto ex = send("POST", "/v1/chat/completions", chat("hey", R"("stream":true,)"));
  ASSERT_TRUE(loop_.run_until([&] { return ex->complete(); }));
  EXPECT_TRUE(ex->streaming());
  EXPECT_EQ(ex->content_type().rfind("text/event-stream", 0), 0u);
  EXPECT_NE(ex->body().find(R"("content":"h")"), std::string::npos);
  EXPECT_EQ(ex->body().substr(ex->body().size() - 14), "data: [DONE]\n\n");
}

TEST_F(ApiServerTest, DisconnectCancelsAndBlocksReturn) {
  std::string long_text(200, 'x');
  auto ex = send("POST", "/v1/chat/completions", chat(long_text, R"("stream":true,)"));
  ASSERT_TRUE(loop_.run_until([&] { return ex->body().size() > 500; }));
  EXPECT_GT(engine_->stats().num_kv_blocks_used, 0);
  ex->disconnect();
  EXPECT_EQ(api_->num_active_requests(), 0);
  ASSERT_TRUE(loop_.run_until([&] { return engine_->stats().num_running == 0 && engine_->stats().num_waiting == 0; }));
  EXPECT_EQ(engine_->stats().num_kv_blocks_used, 0);
  EXPECT_EQ(api_->metrics().num_cancelled(), 1u);
}

TEST_F(ApiServerTest, SlowClientIsDroppedAndItsRequestCancelled) {
  std::string long_text(200, 'y');
  auto ex = send("POST", "/v1/chat/completions", chat(long_text, R"("stream":true,)"), {}, /*max_write=*/2000);
  ASSERT_TRUE(loop_.run_until([&] { return ex->closed(); }));
  ASSERT_TRUE(loop_.run_until([&] { return engine_->stats().num_running == 0; }));
  EXPECT_EQ(engine_->stats().num_kv_blocks_used, 0);
  EXPECT_EQ(api_->num_active_requests(), 0);
}

TEST_F(ApiServerTest, ContextOverflowIs400ContextLengthExceeded) {
  auto ex = send("POST", "/v1/chat/completions", chat("hi", R"("max_tokens":100000,)"));
  ASSERT_TRUE(ex->complete());
  EXPECT_EQ(ex->status(), 400);
  json body = json::parse(ex->body());
  EXPECT_EQ(body["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
}

TEST_F(ApiServerTest, UnknownModelRouteAndMethod) {
  auto model = send("POST", "/v1/chat/completions", R"({"model":"gpt-9","messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(model->status(), 404);
  EXPECT_EQ(json::parse(model->body())["error"]["code"], "model_not_found");
  EXPECT_EQ(send("GET", "/v2/nothing", "")->status(), 404);
  EXPECT_EQ(send("GET", "/v1/chat/completions", "")->status(), 405);
  auto anthropic = send("POST", "/anthropic/v1/messages", R"({"model":"x","max_tokens":1,"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(anthropic->status(), 404);
  EXPECT_EQ(json::parse(anthropic->body())["type"], "error");
}

TEST_F(ApiServerTest, BodyTooLargeIs413InTheProtocolsShape) {
  auto ex = std::make_shared<FakeExchange>(loop_);
  HttpRequest request{"POST", "/v1/messages", {}, "", true};
  api_->handle(request, ex);
  EXPECT_EQ(ex->status(), 413);
  EXPECT_EQ(json::parse(ex->body())["error"]["type"], "request_too_large");
}

TEST_F(ApiServerTest, ApiKeyIsRequiredWhenSet) {
  ApiServerOptions options;
  options.api_key = "sekret";
  make(options);
  EXPECT_EQ(send("POST", "/v1/chat/completions", chat("x"))->status(), 401);
  EXPECT_EQ(send("POST", "/v1/chat/completions", chat("x"), {{"Authorization", "Bearer wrong"}})->status(), 401);
  auto ok = send("POST", "/v1/chat/completions", chat("x"), {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(loop_.run_until([&] { return ok->complete(); }));
  EXPECT_EQ(ok->status(), 200);
  auto anthropic = send("POST", "/v1/messages", R"({"model":"echo","max_tokens":2,"messages":[{"role":"user","content":"x"}]})",
                        {{"x-api-key", "sekret"}});
  ASSERT_TRUE(loop_.run_until([&] { return anthropic->complete(); }));
  EXPECT_EQ(anthropic->status(), 200);
  EXPECT_EQ(send("GET", "/health", "")->status(), 200);  // probes need no key
}

TEST_F(ApiServerTest, QueueFullIs429) {
  ApiServerOptions options;
  options.max_queued = 1;
  EchoEngineOptions engine_options;
  engine_options.max_running = 0;  // nothing ever starts: the first request stays queued
  make(options, engine_options);
  auto first = send("POST", "/v1/chat/completions", chat("x"));
  auto second = send("POST", "/v1/chat/completions", chat("x"));
  EXPECT_FALSE(first->complete());
  EXPECT_EQ(second->status(), 429);
  first->disconnect();
}

TEST_F(ApiServerTest, DrainingRefusesNewWorkAndHealthTurns503) {
  EXPECT_EQ(send("GET", "/health", "")->status(), 200);
  api_->start_draining();
  EXPECT_EQ(send("GET", "/health", "")->status(), 503);
  EXPECT_EQ(send("POST", "/v1/chat/completions", chat("x"))->status(), 503);
}

TEST_F(ApiServerTest, HealthIs503UntilTheModelIsSet) {
  ApiServer api({});
  auto ex = std::make_shared<FakeExchange>(loop_);
  api.handle({"GET", "/health", {}, "", false}, ex);
  EXPECT_EQ(ex->status(), 503);
}

TEST_F(ApiServerTest, MetricsReportRequestsTokensAndBlocks) {
  complete("/v1/chat/completions", chat("abc"));
  auto ex = send("GET", "/metrics", "");
  const std::string& text = ex->body();
  EXPECT_NE(text.find(R"(dsinfer_requests_total{route="/v1/chat/completions",status="200"} 1)"), std::string::npos) << text;
  EXPECT_NE(text.find("dsinfer_generated_tokens_total 4"), std::string::npos);
  EXPECT_NE(text.find("dsinfer_time_to_first_token_seconds_count 1"), std::string::npos);
  EXPECT_NE(text.find("dsinfer_kv_blocks_total"), std::string::npos);
}

TEST_F(ApiServerTest, CompletionsWithTokenIdsAndEcho) {
  auto ex = complete("/v1/completions", R"({"model":"echo","prompt":[104,105],"max_tokens":5,"echo":true})");
  json body = json::parse(ex->body());
  EXPECT_EQ(body["choices"][0]["text"], "hihi");
  auto bad = send("POST", "/v1/completions", R"({"model":"echo","prompt":[100000]})");
  EXPECT_EQ(bad->status(), 400);
}

// The bytes of a logprobs.content list's tokens, joined.
std::string joined_bytes(const json& entries) {
  std::string bytes;
  for (const json& e : entries)
    for (const json& b : e["bytes"]) bytes += static_cast<char>(b.get<int>());
  return bytes;
}

TEST_F(ApiServerTest, ChatLogprobsCoverTheContentTokensOnly) {
  // The echo engine's tokens are bytes, each certain: é is two tokens, neither a whole character.
  const std::string logprobs = R"("logprobs":true,"top_logprobs":2,)";
  auto ex = complete("/v1/chat/completions", chat("<think>r</think>h\xc3\xa9!", logprobs));
  ASSERT_EQ(ex->status(), 200) << ex->body();
  const json choice = json::parse(ex->body())["choices"][0];
  EXPECT_EQ(choice["message"]["content"], "h\xc3\xa9!");
  const json& entries = choice["logprobs"]["content"];
  ASSERT_EQ(entries.size(), 4u) << entries;  // no reasoning, markup or end-of-turn token
  EXPECT_EQ(joined_bytes(entries), "h\xc3\xa9!");
  EXPECT_EQ(entries[1]["token"], "\xef\xbf\xbd");
  EXPECT_EQ(entries[1]["bytes"], json::array({0xc3}));
  for (const json& e : entries) {
    EXPECT_EQ(e["logprob"], 0.0);
    ASSERT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
    EXPECT_EQ(e["top_logprobs"][1]["logprob"], -9999.0);
  }

  auto stopped = complete("/v1/chat/completions", chat("one two three", logprobs + R"("stop":["three"],)"));
  EXPECT_EQ(joined_bytes(json::parse(stopped->body())["choices"][0]["logprobs"]["content"]), "one two ");

  const std::string tools = R"("tools":[{"type":"function","function":{"name":"get"}}],)";
  auto call = complete("/v1/chat/completions", chat("ok<tool_call>get\n{}</tool_call>", logprobs + tools));
  const json called = json::parse(call->body())["choices"][0];
  EXPECT_EQ(called["finish_reason"], "tool_calls");
  EXPECT_EQ(joined_bytes(called["logprobs"]["content"]), "ok");

  auto none = complete("/v1/chat/completions", chat("ab"));
  EXPECT_TRUE(json::parse(none->body())["choices"][0]["logprobs"].is_null());
}

TEST_F(ApiServerTest, StreamedChatLogprobsComeWithTheirText) {
  auto ex = send("POST", "/v1/chat/completions", chat("x<y \xc3\xa9<think>", R"("stream":true,"logprobs":true,)"));
  ASSERT_TRUE(loop_.run_until([&] { return ex->complete(); }));
  std::string content;
  size_t num_chunks_with_text = 0;
  for (size_t pos = 0; (pos = ex->body().find("data: {", pos)) != std::string::npos;) {
    const size_t end = ex->body().find('\n', pos);
    const json chunk = json::parse(ex->body().substr(pos + 6, end - pos - 6));
    pos = end;
    const json& c = chunk["choices"][0];
    const std::string text = c["delta"].value("content", "");
    if (text.empty()) continue;
    ++num_chunks_with_text;
    content += text;
    EXPECT_EQ(joined_bytes(c["logprobs"]["content"]), text);
  }
  EXPECT_EQ(content, "x<y \xc3\xa9");
  EXPECT_GE(num_chunks_with_text, 3u);
}

TEST_F(ApiServerTest, CompletionsLogprobsListTheTokens) {
  auto ex = complete("/v1/completions", R"({"model":"echo","prompt":"abc","max_tokens":3,"logprobs":1})");
  ASSERT_EQ(ex->status(), 200) << ex->body();
  const json logprobs = json::parse(ex->body())["choices"][0]["logprobs"];
  EXPECT_EQ(logprobs["tokens"], json::array({"a", "b", "c"}));
  EXPECT_EQ(logprobs["text_offset"], json::array({0, 1, 2}));
  EXPECT_EQ(logprobs["token_logprobs"], json::array({0.0, 0.0, 0.0}));
  EXPECT_EQ(logprobs["top_logprobs"][2], json({{"c", 0.0}}));
}

TEST_F(ApiServerTest, ResponsesLogprobsCoverTheMessageText) {
  auto ex = complete("/v1/responses", R"({"model":"echo","input":"<think>r</think>ok","top_logprobs":1,)"
                                      R"("include":["message.output_text.logprobs"]})");
  ASSERT_EQ(ex->status(), 200) << ex->body();
  const json part = json::parse(ex->body())["output"][1]["content"][0];
  EXPECT_EQ(part["text"], "ok");
  EXPECT_EQ(joined_bytes(part["logprobs"]), "ok");
  EXPECT_EQ(part["logprobs"][1]["top_logprobs"].size(), 1u);
}

TEST_F(ApiServerTest, LogitBiasBeyondTheVocabularyIs400) {
  auto bad = complete("/v1/chat/completions", chat("ab", R"("logit_bias":{"259":1},)"));
  EXPECT_EQ(bad->status(), 400);
  EXPECT_EQ(json::parse(bad->body())["error"]["param"], "logit_bias");
  auto good = complete("/v1/chat/completions", chat("ab", R"("logit_bias":{"258":1},)"));
  EXPECT_EQ(good->status(), 200) << good->body();
}

TEST_F(ApiServerTest, AbortAllEndsStreamsInFlight) {
  auto ex = send("POST", "/v1/chat/completions", chat(std::string(200, 'z'), R"("stream":true,)"));
  ASSERT_TRUE(loop_.run_until([&] { return ex->body().size() > 300; }));
  api_->abort_all();
  EXPECT_TRUE(ex->complete());
  EXPECT_EQ(api_->num_active_requests(), 0);
  EXPECT_NE(ex->body().find("[DONE]"), std::string::npos);
}

}  // namespace
}  // namespace dsinfer::server
