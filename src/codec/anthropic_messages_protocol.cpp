// Anthropic Messages: content blocks → Conversation, and output events → content blocks.
#include "codec/anthropic_messages_protocol.h"

#include <nlohmann/json.hpp>

#include "codec/request_fields.h"

namespace dsinfer::codec {

using nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string text_of(const json& content, const std::string& path) {
  return flatten_text_content(content, path, {"text"});
}

// One Anthropic message may expand to several conversation messages: a user turn's
// tool_result blocks become tool messages (the DeepSeek templates' form), its text a user one.
void append_message(const json& m, const std::string& path, Conversation& conversation) {
  if (!m.is_object()) reject(path, "Invalid type for '" + path + "': expected an object, but got " + std::string(json_type_name(m)) + " instead.");
  auto role = get_string(m, "role", path + ".role");
  if (!role) reject(path + ".role", path + ".role: Field required");
  if (*role != "user" && *role != "assistant") {
    reject(path + ".role", path + ".role: Input should be 'user' or 'assistant'");
  }
  const json* content = find_field(m, "content");
  if (!content) reject(path + ".content", path + ".content: Field required");
  bool is_user = *role == "user";
  Message message;
  message.role = is_user ? Role::kUser : Role::kAssistant;
  if (content->is_string()) {
    message.content = content->get<std::string>();
    conversation.messages.push_back(std::move(message));
    return;
  }
  if (!content->is_array()) reject(path + ".content", path + ".content: Input should be a valid string or list of blocks");
  std::vector<Message> tool_results;
  for (size_t i = 0; i < content->size(); ++i) {
    const json& block = (*content)[i];
    std::string bpath = path + ".content[" + std::to_string(i) + "]";
    if (!block.is_object()) reject(bpath, bpath + ": Input should be an object");
    auto type = get_string(block, "type", bpath + ".type");
    if (!type) reject(bpath + ".type", bpath + ".type: Field required");
    if (*type == "text") {
      auto text = get_string(block, "text", bpath + ".text");
      if (!text) reject(bpath + ".text", bpath + ".text: Field required");
      message.content += *text;
    } else if (*type == "thinking" && !is_user) {
      message.reasoning_content = message.reasoning_content.value_or("") + get_string(block, "thinking", bpath + ".thinking").value_or("");
    } else if (*type == "redacted_thinking" && !is_user) {
      // Opaque to this server; nothing to render.
    } else if (*type == "tool_use" && !is_user) {
      ToolCall call;
      auto id = get_string(block, "id", bpath + ".id");
      auto name = get_string(block, "name", bpath + ".name");
      if (!id) reject(bpath + ".id", bpath + ".id: Field required");
      if (!name || name->empty()) reject(bpath + ".name", bpath + ".name: Field required");
      const json* input = find_field(block, "input");
      if (input && !input->is_object()) reject(bpath + ".input", bpath + ".input: Input should be an object");
      call.id = *id;
      call.name = *name;
      call.arguments_json = input ? dump(*input) : "{}";
      message.tool_calls.push_back(std::move(call));
    } else if (*type == "tool_result" && is_user) {
      auto id = get_string(block, "tool_use_id", bpath + ".tool_use_id");
      if (!id) reject(bpath + ".tool_use_id", bpath + ".tool_use_id: Field required");
      Message result;
      result.role = Role::kTool;
      result.tool_call_id = *id;
      if (const json* c = find_field(block, "content")) result.content = text_of(*c, bpath + ".content");
      if (get_bool(block, "is_error", bpath + ".is_error").value_or(false)) result.content = "Error: " + result.content;
      tool_results.push_back(std::move(result));
    } else {
      reject(bpath + ".type", bpath + ".type: the block type '" + *type + "' is not supported in a " + *role +
                                  " message by this server (text, tool_use, tool_result and thinking are).");
    }
  }
  for (auto& r : tool_results) conversation.messages.push_back(std::move(r));
  if (!is_user || !message.content.empty() || tool_results.empty()) conversation.messages.push_back(std::move(message));
}

}  // namespace

Result<ApiRequest> parse_messages_request(std::string_view body_text, std::string* error_param) {
  return run_parser(
      [&]() -> ApiRequest {
        json body = parse_body_object(body_text);
        ApiRequest request;
        request.protocol = ApiProtocol::kMessages;
        auto model = get_string(body, "model", "model");
        if (!model) reject("model", "model: Field required");
        request.model = *model;
        auto max_tokens = read_max_tokens(body, "max_tokens");
        if (!max_tokens) reject("max_tokens", "max_tokens: Field required");
        request.sampling.max_tokens = *max_tokens;
        request.max_tokens_given = true;
        if (const json* system = find_field(body, "system")) {
          request.conversation.messages.push_back({Role::kSystem, text_of(*system, "system"), std::nullopt, {}, ""});
        }
        const json* messages = find_field(body, "messages");
        if (!messages) reject("messages", "messages: Field required");
        if (!messages->is_array()) reject("messages", "messages: Input should be a valid list");
        if (messages->empty()) reject("messages", "messages: at least one message is required");
        for (size_t i = 0; i < messages->size(); ++i) {
          append_message((*messages)[i], "messages." + std::to_string(i), request.conversation);
        }
        if (auto t = get_number(body, "temperature", "temperature", 0.0, 1.0)) request.sampling.temperature = static_cast<float>(*t);
        if (auto p = get_number(body, "top_p", "top_p", 0.0, 1.0)) {
          if (*p <= 0.0) reject("top_p", "top_p: must be greater than 0");
          request.sampling.top_p = static_cast<float>(*p);
        }
        if (auto k = get_integer(body, "top_k", "top_k", 0, 1 << 20)) request.sampling.top_k = static_cast<int>(*k);
        request.stop = read_stop_strings(body, "stop_sequences");
        request.stream = get_bool(body, "stream", "stream").value_or(false);
        if (const json* md = find_field(body, "metadata"); md && !md->is_object()) {
          reject("metadata", "metadata: Input should be an object");
        }

        if (const json* tools = find_field(body, "tools")) {
          if (!tools->is_array()) reject("tools", "tools: Input should be a valid list");
          for (size_t i = 0; i < tools->size(); ++i) {
            const json& t = (*tools)[i];
            std::string path = "tools." + std::to_string(i);
            if (!t.is_object()) reject(path, path + ": Input should be an object");
            auto type = get_string(t, "type", path + ".type").value_or("custom");
            if (type != "custom") reject(path + ".type", path + ".type: only custom (client) tools are supported");
            auto name = get_string(t, "name", path + ".name");
            if (!name || name->empty()) reject(path + ".name", path + ".name: Field required");
            ToolDefinition def;
            def.name = *name;
            def.description = get_string(t, "description", path + ".description").value_or("");
            const json* schema = find_field(t, "input_schema");
            if (!schema) reject(path + ".input_schema", path + ".input_schema: Field required");
            def.parameters_json = schema_text(schema, path + ".input_schema");
            request.conversation.tools.push_back(std::move(def));
          }
        }
        if (const json* tc = find_field(body, "tool_choice")) {
          if (!tc->is_object()) reject("tool_choice", "tool_choice: Input should be an object");
          auto type = get_string(*tc, "type", "tool_choice.type");
          if (!type) reject("tool_choice.type", "tool_choice.type: Field required");
          if (*type == "auto") request.tool_choice.mode = ToolChoiceMode::kAuto;
          else if (*type == "any") request.tool_choice.mode = ToolChoiceMode::kRequired;
          else if (*type == "none") request.tool_choice.mode = ToolChoiceMode::kNone;
          else if (*type == "tool") {
            auto name = get_string(*tc, "name", "tool_choice.name");
            if (!name) reject("tool_choice.name", "tool_choice.name: Field required");
            request.tool_choice = {ToolChoiceMode::kNamed, *name};
          } else {
            reject("tool_choice.type", "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'");
          }
          check_tool_choice(request.tool_choice, request.conversation, "tool_choice");
        }
        if (const json* thinking = find_field(body, "thinking")) {
          if (!thinking->is_object()) reject("thinking", "thinking: Input should be an object");
          auto type = get_string(*thinking, "type", "thinking.type");
          if (!type || (*type != "enabled" && *type != "disabled")) reject("thinking.type", "thinking.type: Input should be 'enabled' or 'disabled'");
          request.thinking = *type == "enabled";
        }
        return request;
      },
      error_param);
}

// ---------------------------------------------------------------------------------------------

namespace {

enum class BlockKind { kNone, kText, kThinking, kToolUse };

struct Block {
  BlockKind kind;
  std::string text;  // text, thinking, or the tool input JSON
  std::string id;
  std::string name;
};

class MessagesEncoder : public ProtocolEncoder {
 public:
  explicit MessagesEncoder(EncoderOptions options) : options_(std::move(options)) {}

  void begin(std::string& out) override {
    if (!options_.stream) return;
    json message = message_json(nullptr, nullptr, 1);
    emit("message_start", {{"message", message}}, out);
  }

  void on_event(int, const OutputEvent& event, std::string& out) override {
    switch (event.kind) {
      case OutputEventKind::kContent:
        if (event.text.empty()) return;
        open_block(BlockKind::kText, "", out);
        blocks_.back().text += event.text;
        delta({{"type", "text_delta"}, {"text", event.text}}, out);
        break;
      case OutputEventKind::kReasoning:
        if (event.text.empty()) return;
        open_block(BlockKind::kThinking, "", out);
        blocks_.back().text += event.text;
        delta({{"type", "thinking_delta"}, {"thinking", event.text}}, out);
        break;
      case OutputEventKind::kToolCallBegin:
        close_block(out);
        open_block(BlockKind::kToolUse, event.text, out);
        break;
      case OutputEventKind::kToolCallArgs:
        if (open_ != BlockKind::kToolUse || event.text.empty()) return;
        blocks_.back().text += event.text;
        delta({{"type", "input_json_delta"}, {"partial_json", event.text}}, out);
        break;
      case OutputEventKind::kToolCallEnd:
        close_block(out);
        break;
      case OutputEventKind::kStop:
        break;
    }
  }

  void end_choice(int, ChoiceEnd end, const std::string& stop_string, std::string& out) override {
    close_block(out);
    bool has_tool_use = false;
    for (const auto& b : blocks_) has_tool_use = has_tool_use || b.kind == BlockKind::kToolUse;
    switch (end) {
      case ChoiceEnd::kEndOfTurn: stop_reason_ = has_tool_use ? "tool_use" : "end_turn"; break;
      case ChoiceEnd::kStopString: stop_reason_ = "stop_sequence"; stop_sequence_ = stop_string; break;
      case ChoiceEnd::kLength: stop_reason_ = "max_tokens"; break;
      case ChoiceEnd::kCancelled: stop_reason_ = "refusal"; break;
      case ChoiceEnd::kError: stop_reason_ = "end_turn"; break;
    }
  }

  void end(const UsageCounts& usage, std::string& out) override {
    json stop_sequence = stop_sequence_.empty() ? json(nullptr) : json(stop_sequence_);
    // The prefix-cache hit is known only once the engine has admitted the request, after
    // message_start went out; the final usage carries it (message_delta's usage overrides).
    options_.num_prompt_tokens = usage.prompt_tokens;
    options_.num_cached_prompt_tokens = usage.cached_prompt_tokens;
    if (!options_.stream) {
      out += dump(message_json(json(stop_reason_), stop_sequence, usage.completion_tokens));
      return;
    }
    emit("message_delta",
         {{"delta", {{"stop_reason", stop_reason_}, {"stop_sequence", stop_sequence}}},
          {"usage",
           {{"input_tokens", usage.prompt_tokens - usage.cached_prompt_tokens},
            {"cache_read_input_tokens", usage.cached_prompt_tokens},
            {"output_tokens", usage.completion_tokens}}}}, out);
    emit("message_stop", json::object(), out);
  }

  void stream_error(const ApiError& error, std::string& out) override {
    emit("error", {{"error", {{"type", error_type_for_status(ApiProtocol::kMessages, error.http_status)}, {"message", error.message}}}}, out);
  }

 private:
  void emit(const char* type, json event, std::string& out) {
    event["type"] = type;
    append_sse(out, type, dump(event));
  }

  void delta(json d, std::string& out) {
    if (options_.stream) emit("content_block_delta", {{"index", blocks_.size() - 1}, {"delta", std::move(d)}}, out);
  }

  json block_json(const Block& b, bool at_start) const {
    switch (b.kind) {
      case BlockKind::kText: return {{"type", "text"}, {"text", at_start ? "" : b.text}};
      case BlockKind::kThinking: return {{"type", "thinking"}, {"thinking", at_start ? "" : b.text}, {"signature", ""}};
      case BlockKind::kToolUse: {
        json input = json::object();
        if (!at_start) {
          // Arguments the model wrote that are not a JSON object are passed as a string.
          json parsed = json::parse(b.text.empty() ? "{}" : b.text, nullptr, false);
          input = parsed.is_object() ? parsed : json{{"_raw", b.text}};
        }
        return {{"type", "tool_use"}, {"id", b.id}, {"name", b.name}, {"input", input}};
      }
      case BlockKind::kNone: break;
    }
    return json::object();
  }

  void open_block(BlockKind kind, const std::string& name, std::string& out) {
    if (open_ == kind && kind != BlockKind::kToolUse) return;
    close_block(out);
    Block b{kind, "", "", name};
    if (kind == BlockKind::kToolUse) {
      b.id = "toolu_" + options_.response_id.substr(options_.response_id.find('_') + 1) + "_" + std::to_string(blocks_.size());
    }
    blocks_.push_back(b);
    open_ = kind;
    if (options_.stream) emit("content_block_start", {{"index", blocks_.size() - 1}, {"content_block", block_json(b, true)}}, out);
  }

  void close_block(std::string& out) {
    if (open_ == BlockKind::kNone) return;
    open_ = BlockKind::kNone;
    if (options_.stream) emit("content_block_stop", {{"index", blocks_.size() - 1}}, out);
  }

  json message_json(json stop_reason, json stop_sequence, int output_tokens) const {
    json content = json::array();
    for (const auto& b : blocks_) content.push_back(block_json(b, false));
    return {{"id", options_.response_id},
            {"type", "message"},
            {"role", "assistant"},
            {"model", options_.model},
            {"content", content},
            {"stop_reason", std::move(stop_reason)},
            {"stop_sequence", std::move(stop_sequence)},
            {"usage",
             {{"input_tokens", options_.num_prompt_tokens - options_.num_cached_prompt_tokens},
              {"cache_read_input_tokens", options_.num_cached_prompt_tokens},
              {"cache_creation_input_tokens", 0},
              {"output_tokens", output_tokens}}}};
  }

  EncoderOptions options_;
  std::vector<Block> blocks_;
  BlockKind open_ = BlockKind::kNone;
  std::string stop_reason_ = "end_turn";
  std::string stop_sequence_;
};

}  // namespace

std::unique_ptr<ProtocolEncoder> make_messages_encoder(EncoderOptions options) {
  return std::make_unique<MessagesEncoder>(std::move(options));
}

}  // namespace dsinfer::codec
