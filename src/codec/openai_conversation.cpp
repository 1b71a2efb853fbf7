#include "codec/openai_conversation.h"

#include <nlohmann/json.hpp>

namespace dsinfer::codec {
namespace {

// Flattens string / null / text-part-array content. Returns false on other shapes.
bool flatten_content(const nlohmann::json& v, std::string& out, std::string& error) {
  if (v.is_null()) return true;
  if (v.is_string()) {
    out = v.get<std::string>();
    return true;
  }
  if (v.is_array()) {
    for (const auto& part : v) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
        error = "only text content parts are supported";
        return false;
      }
      out += part["text"].get<std::string>();
    }
    return true;
  }
  error = "content must be a string, null or an array of text parts";
  return false;
}

std::string json_text(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

Result<Conversation> conversation_from_openai_json(const nlohmann::json& body) {
  if (!body.is_object()) return invalid_argument("request body must be a JSON object");
  if (!body.contains("messages") || !body["messages"].is_array()) return invalid_argument("'messages' must be an array");
  Conversation conv;
  const auto& messages = body["messages"];
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return invalid_argument(where + ": needs a string 'role'");
    const std::string role = m["role"].get<std::string>();
    Message msg;
    if (role == "system" || role == "developer") {
      msg.role = Role::kSystem;
    } else if (role == "user") {
      msg.role = Role::kUser;
    } else if (role == "assistant") {
      msg.role = Role::kAssistant;
    } else if (role == "tool") {
      msg.role = Role::kTool;
    } else {
      return invalid_argument(where + ".role: unknown role '" + role + "'");
    }
    std::string error;
    if (m.contains("content") && !flatten_content(m["content"], msg.content, error))
      return invalid_argument(where + ".content: " + error);
    if (msg.role == Role::kAssistant) {
      for (const char* key : {"reasoning_content", "reasoning"}) {
        if (m.contains(key) && m[key].is_string()) {
          msg.reasoning_content = m[key].get<std::string>();
          break;
        }
      }
      if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
        if (!m["tool_calls"].is_array()) return invalid_argument(where + ".tool_calls must be an array");
        for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
          const auto& tc = m["tool_calls"][k];
          const std::string tw = where + ".tool_calls[" + std::to_string(k) + "]";
          if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
            return invalid_argument(tw + ": needs a 'function' object");
          const auto& fn = tc["function"];
          if (!fn.contains("name") || !fn["name"].is_string()) return invalid_argument(tw + ".function.name must be a string");
          ToolCall call;
          call.id = tc.contains("id") && tc["id"].is_string() ? tc["id"].get<std::string>() : "call_" + std::to_string(k);
          call.name = fn["name"].get<std::string>();
          call.arguments_json = fn.contains("arguments") && !fn["arguments"].is_null() ? json_text(fn["arguments"]) : "{}";
          msg.tool_calls.push_back(std::move(call));
        }
      }
    }
    if (msg.role == Role::kTool && m.contains("tool_call_id") && m["tool_call_id"].is_string())
      msg.tool_call_id = m["tool_call_id"].get<std::string>();
    conv.messages.push_back(std::move(msg));
  }
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) return invalid_argument("'tools' must be an array");
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      const auto& t = body["tools"][i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object())
        return invalid_argument(where + ": needs a 'function' object");
      const auto& fn = t["function"];
      if (!fn.contains("name") || !fn["name"].is_string()) return invalid_argument(where + ".function.name must be a string");
      ToolDefinition def;
      def.name = fn["name"].get<std::string>();
      if (fn.contains("description") && fn["description"].is_string()) def.description = fn["description"].get<std::string>();
      def.parameters_json = fn.contains("parameters") && !fn["parameters"].is_null() ? json_text(fn["parameters"]) : "{}";
      conv.tools.push_back(std::move(def));
    }
  }
  return conv;
}

}  // namespace dsinfer::codec
