// A chat conversation in OpenAI form, protocol-neutral: what the HTTP adapters produce and the
// DeepSeek prompt renderers consume.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dsinfer::codec {

struct ToolCall {
  std::string id;              // e.g. "call_0"
  std::string name;
  std::string arguments_json;  // the arguments object as JSON text
};

enum class Role { kSystem, kUser, kAssistant, kTool };

struct Message {
  Role role = Role::kUser;
  std::string content;                  // text (already flattened from content parts)
  std::optional<std::string> reasoning_content;  // assistant reasoning, if any
  std::vector<ToolCall> tool_calls;     // assistant only
  std::string tool_call_id;             // tool only
};

struct ToolDefinition {
  std::string name;
  std::string description;
  std::string parameters_json;  // JSON Schema text; "{}" when absent
};

struct Conversation {
  std::vector<Message> messages;
  std::vector<ToolDefinition> tools;
};

// What a generation prompt asks of the model.
struct RenderOptions {
  bool add_generation_prompt = true;
  bool thinking = false;  // V3.1: "<think>" (true) or "</think>" (false) after <｜Assistant｜>
};

}  // namespace dsinfer::codec
