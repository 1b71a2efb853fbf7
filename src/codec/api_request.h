// What an HTTP generation request asks for, independent of the protocol it came in: the
// conversation (or raw prompt), sampling, stops, tool policy and how to answer. The three
// protocol adapters (openai_chat_protocol, openai_responses_protocol,
// anthropic_messages_protocol) parse their JSON bodies into this; the server's request session
// consumes it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "codec/conversation.h"
#include "dsinfer/engine_types.h"

namespace dsinfer::codec {

enum class ApiProtocol { kChatCompletions, kCompletions, kResponses, kMessages };

enum class ToolChoiceMode { kAuto, kNone, kRequired, kNamed };

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::kAuto;
  std::string name;  // kNamed only
};

struct ApiRequest {
  ApiProtocol protocol = ApiProtocol::kChatCompletions;
  std::string model;

  // Chat-style requests: rendered with the model family's template.
  Conversation conversation;
  // /v1/completions: the raw prompt, either text (no template) or token ids.
  bool raw_prompt = false;
  std::string prompt_text;
  std::vector<TokenId> prompt_ids;
  bool has_prompt_ids = false;

  SamplingParams sampling;
  // Whether the client gave a token limit; without one the server uses what is left of the
  // context window.
  bool max_tokens_given = false;
  std::vector<std::string> stop;  // stop strings; the matched one is never returned
  int n = 1;                      // Chat Completions / Completions only
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage (streamed usage chunk)
  ToolChoice tool_choice;
  std::optional<bool> thinking;  // DeepSeek thinking on/off; unset = the family's default
  std::string traffic_class;  // KV store retention class: "chat" (default) or "agent"
  bool json_object = false;      // response_format {type: json_object}
  bool echo = false;             // /v1/completions echo
};

// A request-level error in the shape every protocol can express. `param` names the offending
// field ("messages[2].role"), empty when not about one field.
struct ApiError {
  int http_status = 400;
  std::string code;  // e.g. "context_length_exceeded", "invalid_value", "model_not_found"
  std::string param;
  std::string message;
};

// The protocol's error body for `error` (OpenAI {"error":{message,type,param,code}}; Anthropic
// {"type":"error","error":{type,message}}).
std::string error_body(ApiProtocol protocol, const ApiError& error);

// The error type string a protocol uses for an HTTP status ("invalid_request_error", ...).
std::string error_type_for_status(ApiProtocol protocol, int http_status);

}  // namespace dsinfer::codec
