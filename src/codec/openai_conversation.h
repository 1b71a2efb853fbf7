// OpenAI Chat Completions request body → Conversation: the "messages" and "tools" fields.
// Shared by `dsinfer tokenize --chat` and the HTTP server.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "codec/conversation.h"
#include "core/status.h"

namespace dsinfer::codec {

// Accepts roles system/developer (→ system), user, assistant, tool; content as a string,
// null, or an array of {"type":"text","text":...} parts (joined); assistant tool_calls with
// function name/arguments (arguments given as an object are serialised); tool messages'
// tool_call_id; tools as [{"type":"function","function":{name, description, parameters}}].
// Anything else is kInvalidArgument with a message naming the offending field.
Result<Conversation> conversation_from_openai_json(const nlohmann::json& body);

}  // namespace dsinfer::codec
