// Anthropic Messages (POST /v1/messages, also /anthropic/v1/messages): request parsing and the
// response encoder.
//
// Accepted: model, max_tokens (required), messages (user/assistant; text, tool_use,
// tool_result and thinking blocks), system (string or text blocks), stop_sequences,
// temperature (0..1), top_p, top_k, stream, tools ({name, description, input_schema}),
// tool_choice {auto | any | tool | none}, thinking {type: enabled | disabled} (DeepSeek thinking),
// metadata (ignored). Images and documents are rejected with 400.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "codec/api_request.h"
#include "codec/protocol_encoder.h"
#include "core/status.h"

namespace dsinfer::codec {

Result<ApiRequest> parse_messages_request(std::string_view body, std::string* error_param = nullptr);

std::unique_ptr<ProtocolEncoder> make_messages_encoder(EncoderOptions options);

}  // namespace dsinfer::codec
