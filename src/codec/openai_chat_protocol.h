// OpenAI Chat Completions (POST /v1/chat/completions) and legacy Completions
// (POST /v1/completions): request parsing and the response encoders.
//
// Accepted and honoured: messages (system/developer/user/assistant/tool; text content or text
// parts), tools + tool_choice (auto/none/required/named), max_tokens / max_completion_tokens,
// temperature, top_p, top_k, min_p, seed, stop, n, stream, stream_options.include_usage,
// response_format {type: json_object | json_schema | text}, DeepSeek thinking
// ({"thinking": {"type": "enabled"|"disabled"}} or chat_template_kwargs.thinking).
// Accepted and ignored: presence/frequency penalties, logprobs, user, metadata, store.
// response_format json_object/json_schema only adds an instruction to the prompt: the output is
// not constrained to valid JSON until constrained decoding exists.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "codec/api_request.h"
#include "codec/protocol_encoder.h"
#include "core/status.h"

namespace dsinfer::codec {

// On failure *error_param names the offending parameter ("" if none).
Result<ApiRequest> parse_chat_completions_request(std::string_view body, std::string* error_param = nullptr);
Result<ApiRequest> parse_completions_request(std::string_view body, std::string* error_param = nullptr);

std::unique_ptr<ProtocolEncoder> make_chat_completions_encoder(EncoderOptions options);
std::unique_ptr<ProtocolEncoder> make_completions_encoder(EncoderOptions options);
}  // namespace dsinfer::codec
