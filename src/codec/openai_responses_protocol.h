// OpenAI Responses (POST /v1/responses): request parsing and the response encoder.
//
// Accepted: input (a string, or items: messages with input_text/output_text parts,
// function_call, function_call_output, reasoning), instructions, tools (flat function tools),
// tool_choice, max_output_tokens, temperature, top_p, top_k, seed, stream, text.format
// {json_object | json_schema | text} (an instruction only, as for Chat Completions), reasoning
// {effort} (turns DeepSeek thinking on unless "none"/"minimal"), DeepSeek `thinking`.
// Not supported (400): previous_response_id (nothing is stored), non-function tools.
// The answer holds at most one reasoning item, then message/function_call items in order.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "codec/api_request.h"
#include "codec/protocol_encoder.h"
#include "core/status.h"

namespace dsinfer::codec {

Result<ApiRequest> parse_responses_request(std::string_view body, std::string* error_param = nullptr);

std::unique_ptr<ProtocolEncoder> make_responses_encoder(EncoderOptions options);

}  // namespace dsinfer::codec
