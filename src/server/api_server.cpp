// ApiServer: routing, admission and prompt preparation; sessions do the streaming.
#include "server/api_server.h"

#include <nlohmann/json.hpp>

#include "codec/anthropic_messages_protocol.h"
#include "codec/openai_chat_protocol.h"
#include "codec/openai_responses_protocol.h"
#include "core/logging.h"
#include "server/generation_session.h"

namespace dsinfer::server {

using codec::ApiProtocol;
using nlohmann::json;

namespace {

// Compares in time independent of where the strings differ (only the length leaks).
bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size() || b.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

struct Route {
  const char* path;
  const char* method;
  int kind;  // 0..3 = ApiProtocol, 10 models, 11 health, 12 metrics
};

constexpr int kModels = 10, kHealth = 11, kMetrics = 12;

const Route kRoutes[] = {
    {"/v1/chat/completions", "POST", static_cast<int>(ApiProtocol::kChatCompletions)},
    {"/v1/completions", "POST", static_cast<int>(ApiProtocol::kCompletions)},
    {"/v1/responses", "POST", static_cast<int>(ApiProtocol::kResponses)},
    {"/v1/messages", "POST", static_cast<int>(ApiProtocol::kMessages)},
    {"/anthropic/v1/messages", "POST", static_cast<int>(ApiProtocol::kMessages)},
    {"/v1/models", "GET", kModels},
    {"/health", "GET", kHealth},
    {"/metrics", "GET", kMetrics},
};

ApiProtocol protocol_for_path(const std::string& path) {
  if (path.rfind("/anthropic/", 0) == 0 || path == "/v1/messages") return ApiProtocol::kMessages;
  return ApiProtocol::kChatCompletions;
}

void add_instruction(codec::Conversation& conversation, const std::string& text) {
  if (!conversation.messages.empty() && conversation.messages.front().role == codec::Role::kSystem) {
    conversation.messages.front().content += "\n\n" + text;
    return;
  }
  codec::Message m;
  m.role = codec::Role::kSystem;
  m.content = text;
  conversation.messages.insert(conversation.messages.begin(), std::move(m));
}

const char* prompt_param(ApiProtocol protocol) {
  switch (protocol) {
    case ApiProtocol::kCompletions: return "prompt";
    case ApiProtocol::kResponses: return "input";
    default: return "messages";
  }
}

}  // namespace

ApiServer::ApiServer(ApiServerOptions options) : options_(std::move(options)), rng_(std::random_device{}()) {
  if (options_.created_s == 0) {
    options_.created_s = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
}

ApiServer::~ApiServer() = default;

void ApiServer::set_model(EngineClient* engine, const ModelCodec* codec) {
  codec_.store(codec);
  engine_.store(engine);
}

void ApiServer::start_draining() { draining_ = true; }

void ApiServer::abort_all() {
  auto sessions = sessions_;  // sessions remove themselves as they end
  for (auto& [id, session] : sessions) session->abort();
}

std::string ApiServer::new_id(const char* prefix) {
  static const char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  uint64_t a = rng_(), b = rng_();
  for (int i = 0; i < 16; ++i) id += kHex[(a >> (i * 4)) & 15];
  for (int i = 0; i < 8; ++i) id += kHex[(b >> (i * 4)) & 15];
  return id;
}

void ApiServer::respond_error(const std::string& route, ApiProtocol protocol, HttpExchange& exchange, int status,
                              const std::string& code, const std::string& param, const std::string& message) {
  codec::ApiError error{status, code, param, message};
  std::vector<std::pair<std::string, std::string>> headers;
  if (status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
  exchange.respond(status, "application/json", codec::error_body(protocol, error), std::move(headers));
  metrics_.count_request(route, status);
}

void ApiServer::handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) {
  // Nothing a request does may take the I/O loop down; an unexpected exception is a 500.
  try {
    route(request, exchange);
  } catch (const std::exception& e) {
    DS_LOG_ERROR("http: " << request.method << " " << request.target << ": " << e.what());
    if (!exchange->closed()) {
      respond_error("other", protocol_for_path(request.path()), *exchange, 500, "internal_error", "",
                    "The server failed on this request.");
    }
  }
}

void ApiServer::route(HttpRequest& request, const std::shared_ptr<HttpExchange>& exchange) {
  const std::string path = request.path();
  const Route* route = nullptr;
  bool path_known = false;
  std::string model_id;
  for (const auto& r : kRoutes) {
    if (path == r.path) {
      path_known = true;
      if (request.method == r.method) route = &r;
    }
  }
  if (!route && request.method == "GET" && path.rfind("/v1/models/", 0) == 0 && path.size() > 11) {
    static const Route kModelRoute = {"/v1/models/{id}", "GET", kModels};
    route = &kModelRoute;
    path_known = true;
    model_id = path.substr(11);
  }
  ApiProtocol protocol = protocol_for_path(path);
  if (!route) {
    if (path_known) {
      respond_error("other", protocol, *exchange, 405, "method_not_allowed", "",
                    "Method " + request.method + " is not allowed on " + path + ".");
    } else {
      respond_error("other", protocol, *exchange, 404, "unknown_url", "", "Unknown request URL: " + request.method + " " + path + ".");
    }
    return;
  }
  const std::string label = route->path;

  if (route->kind == kHealth) {
    EngineClient* engine = engine_.load();
    const Status engine_health = engine ? engine->health() : Status();
    const bool ready = engine && !draining_ && engine_health.ok();
    nlohmann::json body;
    body["status"] = ready ? "ok" : draining_ ? "shutting_down" : !engine ? "loading" : "engine_failed";
    if (!engine_health.ok()) body["message"] = engine_health.message();
    exchange->respond(ready ? 200 : 503, "application/json", body.dump());
    metrics_.count_request(label, ready ? 200 : 503);
    return;
  }
  if (route->kind == kMetrics) {
    ServerGauges gauges;
    gauges.num_queued_requests = num_queued_;
    gauges.num_running_requests = num_running_;
    gauges.num_open_connections = connection_counter_ ? connection_counter_() : 0;
    std::string engine_text;
    if (EngineClient* engine = engine_.load()) {
      gauges.engine = engine->stats();
      gauges.have_engine = true;
      engine_text = engine->metrics_text();
    }
    metrics_.count_request(label, 200);
    exchange->respond(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.render(gauges) + engine_text);
    return;
  }

  if (!options_.api_key.empty()) {
    std::string key = request.header("x-api-key");
    std::string auth = request.header("authorization");
    if (auth.size() > 7 && (auth.compare(0, 7, "Bearer ") == 0 || auth.compare(0, 7, "bearer ") == 0)) key = auth.substr(7);
    if (!constant_time_equal(key, options_.api_key)) {
      respond_error(label, protocol, *exchange, 401, "invalid_api_key", "",
                    key.empty() ? "Missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'."
                                : "Incorrect API key provided.");
      return;
    }
  }

  if (route->kind == kModels) {
    json card = {{"id", options_.served_model_name},
                 {"object", "model"},
                 {"created", options_.created_s},
                 {"owned_by", "dsinfer"}};
    if (EngineClient* engine = engine_.load()) card["max_model_len"] = engine->max_context_tokens();
    if (!model_id.empty()) {
      if (model_id != options_.served_model_name) {
        respond_error(label, protocol, *exchange, 404, "model_not_found", "model", "The model '" + model_id + "' does not exist.");
        return;
      }
      exchange->respond(200, "application/json", card.dump());
    } else {
      exchange->respond(200, "application/json", json({{"object", "list"}, {"data", json::array({card})}}).dump());
    }
    metrics_.count_request(label, 200);
    return;
  }
  generate(label, static_cast<ApiProtocol>(route->kind), request, exchange);
}

void ApiServer::generate(const std::string& route, ApiProtocol protocol, HttpRequest& http_request,
                         std::shared_ptr<HttpExchange> exchange) {
  auto arrival = std::chrono::steady_clock::now();
  if (http_request.body_too_large) {
    respond_error(route, protocol, *exchange, 413, "request_too_large", "", "The request body is larger than this server accepts.");
    return;
  }
  if (draining_) {
    respond_error(route, protocol, *exchange, 503, "shutting_down", "", "The server is shutting down.");
    return;
  }
  EngineClient* engine = engine_.load();
  const ModelCodec* model_codec = codec_.load();
  if (!engine || !model_codec) {
    respond_error(route, protocol, *exchange, 503, "model_loading", "", "The model is still loading; retry shortly.");
    return;
  }

  std::string error_param;
  Result<codec::ApiRequest> parsed = Status(StatusCode::kInternal, "unparsed");
  switch (protocol) {
    case ApiProtocol::kChatCompletions: parsed = codec::parse_chat_completions_request(http_request.body, &error_param); break;
    case ApiProtocol::kCompletions: parsed = codec::parse_completions_request(http_request.body, &error_param); break;
    case ApiProtocol::kResponses: parsed = codec::parse_responses_request(http_request.body, &error_param); break;
    case ApiProtocol::kMessages: parsed = codec::parse_messages_request(http_request.body, &error_param); break;
  }
  if (!parsed.ok()) {
    respond_error(route, protocol, *exchange, 400, "", error_param, parsed.status().message());
    return;
  }
  codec::ApiRequest request = std::move(parsed).value();
  // KV store retention class (TTL) of this request's prompt blocks.
  request.traffic_class = http_request.header("x-dsinfer-traffic-class");
  if (!request.traffic_class.empty() && request.traffic_class != "chat" && request.traffic_class != "agent") {
    respond_error(route, protocol, *exchange, 400, "invalid_value", "x-dsinfer-traffic-class",
                  "Invalid 'x-dsinfer-traffic-class' header: expected 'chat' or 'agent'.");
    return;
  }
  if (request.model != options_.served_model_name) {
    respond_error(route, protocol, *exchange, 404, "model_not_found", "model",
                  "The model '" + request.model + "' does not exist; this server serves '" + options_.served_model_name + "'.");
    return;
  }
  if (num_queued_ >= options_.max_queued) {
    respond_error(route, protocol, *exchange, 429, "queue_full", "",
                  "The server has " + std::to_string(num_queued_) + " requests waiting; retry later.");
    return;
  }

  for (const auto& [token, bias] : request.sampling.logit_bias) {
    if (token >= model_codec->vocab_size()) {
      respond_error(route, protocol, *exchange, 400, "invalid_value", "logit_bias",
                    "Invalid 'logit_bias': token id " + std::to_string(token) + " is outside the vocabulary (" +
                        std::to_string(model_codec->vocab_size()) + " ids).");
      return;
    }
  }

  // The prompt.
  codec::RenderOptions render;
  render.thinking = model_codec->has_thinking_switch() && request.thinking.value_or(model_codec->thinking_by_default());
  std::vector<TokenId> prompt_ids;
  std::string echo_prompt;
  bool starts_in_reasoning = false;
  std::string forced_output_prefix;
  if (request.raw_prompt) {
    if (request.has_prompt_ids) {
      for (TokenId id : request.prompt_ids) {
        if (id >= model_codec->vocab_size()) {
          respond_error(route, protocol, *exchange, 400, "invalid_value", "prompt",
                        "Invalid 'prompt': token id " + std::to_string(id) + " is outside the vocabulary (" +
                            std::to_string(model_codec->vocab_size()) + " ids).");
          return;
        }
      }
      prompt_ids = request.prompt_ids;
      if (request.echo) echo_prompt = model_codec->decode(prompt_ids);
    } else {
      auto encoded = model_codec->encode_text(request.prompt_text);
      if (!encoded.ok()) {
        respond_error(route, protocol, *exchange, 400, "invalid_value", "prompt", encoded.status().message());
        return;
      }
      prompt_ids = std::move(encoded).value();
      if (request.echo) echo_prompt = request.prompt_text;
    }
  } else {
    codec::Conversation conversation = request.conversation;
    switch (request.tool_choice.mode) {
      case codec::ToolChoiceMode::kNone: conversation.tools.clear(); break;
      case codec::ToolChoiceMode::kAuto: break;
      case codec::ToolChoiceMode::kRequired:
        // The call itself is forced below by opening it in the prompt; the instruction helps the
        // model choose well.
        add_instruction(conversation, "You must answer by calling one of the provided tools.");
        break;
      case codec::ToolChoiceMode::kNamed: {
        std::erase_if(conversation.tools, [&](const codec::ToolDefinition& t) { return t.name != request.tool_choice.name; });
        add_instruction(conversation, "You must answer by calling the tool '" + request.tool_choice.name + "'.");
        break;
      }
    }
    if (request.json_object) {
      add_instruction(conversation, "Answer with one valid JSON object and nothing else.");
    }
    auto encoded = model_codec->encode_conversation(conversation, render);
    if (!encoded.ok()) {
      respond_error(route, protocol, *exchange, 400, "invalid_value", prompt_param(protocol), encoded.status().message());
      return;
    }
    prompt_ids = std::move(encoded.value().ids);
    starts_in_reasoning = encoded.value().starts_in_reasoning;
    request.conversation.tools = std::move(conversation.tools);
    // required / named: the server opens the tool call itself, so the model can only continue it.
    const bool must_call = request.tool_choice.mode == codec::ToolChoiceMode::kRequired ||
                           request.tool_choice.mode == codec::ToolChoiceMode::kNamed;
    if (must_call && !request.conversation.tools.empty()) {
      const std::string name = request.tool_choice.mode == codec::ToolChoiceMode::kNamed ? request.tool_choice.name : "";
      if (auto forced = model_codec->forced_tool_call(name, starts_in_reasoning)) {
        prompt_ids.insert(prompt_ids.end(), forced->ids.begin(), forced->ids.end());
        forced_output_prefix = std::move(forced->text);
      }
    }
  }
  if (prompt_ids.empty()) {
    respond_error(route, protocol, *exchange, 400, "invalid_value", prompt_param(protocol), "The prompt is empty.");
    return;
  }

  // The context window: prompt + completion must fit.
  const int64_t context = engine->max_context_tokens();
  const int64_t num_prompt = static_cast<int64_t>(prompt_ids.size());
  if (!request.max_tokens_given) request.sampling.max_tokens = static_cast<int>(std::max<int64_t>(0, context - num_prompt));
  if (num_prompt + request.sampling.max_tokens > context || request.sampling.max_tokens < 1) {
    respond_error(route, protocol, *exchange, 400, "context_length_exceeded", prompt_param(protocol),
                  "This model's maximum context length is " + std::to_string(context) + " tokens. However, you requested " +
                      std::to_string(num_prompt + std::max(1, request.sampling.max_tokens)) + " tokens (" + std::to_string(num_prompt) +
                      " in the prompt, " + std::to_string(std::max(1, request.sampling.max_tokens)) +
                      " for the completion). Please reduce the prompt or the completion length.");
    return;
  }

  SessionSetup setup;
  setup.engine = engine;
  setup.codec = model_codec;
  setup.metrics = &metrics_;
  setup.inbox = inbox_;
  setup.route = route;
  setup.model_name = options_.served_model_name;
  switch (protocol) {
    case ApiProtocol::kChatCompletions: setup.response_id = new_id("chatcmpl-"); break;
    case ApiProtocol::kCompletions: setup.response_id = new_id("cmpl-"); break;
    case ApiProtocol::kResponses: setup.response_id = new_id("resp_"); break;
    case ApiProtocol::kMessages: setup.response_id = new_id("msg_"); break;
  }
  setup.prompt_ids = std::move(prompt_ids);
  setup.echo_prompt = std::move(echo_prompt);
  setup.parser.stop_strings = request.stop;
  setup.parser.parse_reasoning = !request.raw_prompt;
  setup.parser.parse_tool_calls =
      !request.raw_prompt && !request.conversation.tools.empty() && request.tool_choice.mode != codec::ToolChoiceMode::kNone;
  setup.parser.starts_in_reasoning = starts_in_reasoning;
  setup.forced_output_prefix = std::move(forced_output_prefix);
  setup.arrival = arrival;
  uint64_t session_id = next_session_++;
  auto queued = std::make_shared<bool>(true);
  setup.on_first_token = [this, queued] {
    if (*queued) {
      *queued = false;
      --num_queued_;
      ++num_running_;
    }
  };
  setup.on_done = [this, session_id, queued] {
    if (*queued) --num_queued_;
    else --num_running_;
    --num_active_;
    sessions_.erase(session_id);
  };
  metrics_.add_prompt_tokens(static_cast<int>(setup.prompt_ids.size()));

  auto session = std::make_shared<GenerationSession>(std::move(request), std::move(setup), exchange);
  ++num_queued_;
  ++num_active_;
  sessions_[session_id] = session;
  if (auto error = session->start()) {
    --num_queued_;
    --num_active_;
    sessions_.erase(session_id);
    respond_error(route, protocol, *exchange, error->http_status, error->code, "", error->message);
  }
}

}  // namespace dsinfer::server
