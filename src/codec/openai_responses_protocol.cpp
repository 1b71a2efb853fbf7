// OpenAI Responses: request items → Conversation, and output events → response items/events.
#include "codec/openai_responses_protocol.h"

#include <nlohmann/json.hpp>

#include "codec/logprobs_json.h"
#include "codec/request_fields.h"

namespace dsinfer::codec {

using nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const std::vector<std::string> kInputTextParts = {"input_text", "output_text", "text"};

Role role_from(const std::string& role, const std::string& path) {
  if (role == "system" || role == "developer") return Role::kSystem;
  if (role == "user") return Role::kUser;
  if (role == "assistant") return Role::kAssistant;
  reject(path, "Invalid value for '" + path + "': '" + role +
                   "'. Supported values are: 'system', 'developer', 'user' and 'assistant'.");
}

// Function calls attach to the assistant message before them (or a new one), as the DeepSeek
// templates expect calls inside one assistant turn.
Message& assistant_for_calls(Conversation& conversation) {
  if (conversation.messages.empty() || conversation.messages.back().role != Role::kAssistant) {
    Message m;
    m.role = Role::kAssistant;
    conversation.messages.push_back(std::move(m));
  }
  return conversation.messages.back();
}

void parse_input(const json& body, ApiRequest& request) {
  Conversation& conversation = request.conversation;
  if (auto instructions = get_string(body, "instructions", "instructions")) {
    conversation.messages.push_back({Role::kSystem, *instructions, std::nullopt, {}, ""});
  }
  const json* input = find_field(body, "input");
  if (!input) reject("input", "Missing required parameter: 'input'.");
  if (input->is_string()) {
    conversation.messages.push_back({Role::kUser, input->get<std::string>(), std::nullopt, {}, ""});
    return;
  }
  if (!input->is_array()) reject("input", std::string("Invalid type for 'input': expected a string or an array of input items, but got ") + json_type_name(*input) + " instead.");
  if (input->empty()) reject("input", "Invalid 'input': empty array. Expected an array with minimum length 1.");
  std::optional<std::string> pending_reasoning;
  for (size_t i = 0; i < input->size(); ++i) {
    const json& item = (*input)[i];
    std::string path = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) reject(path, "Invalid type for '" + path + "': expected an object, but got " + json_type_name(item) + " instead.");
    std::string type = get_string(item, "type", path + ".type").value_or("message");
    if (type == "message") {
      auto role = get_string(item, "role", path + ".role");
      if (!role) reject(path + ".role", "Missing required parameter: '" + path + ".role'.");
      const json* content = find_field(item, "content");
      if (!content) reject(path + ".content", "Missing required parameter: '" + path + ".content'.");
      Message m;
      m.role = role_from(*role, path + ".role");
      m.content = flatten_text_content(*content, path + ".content", kInputTextParts);
      if (m.role == Role::kAssistant && pending_reasoning) m.reasoning_content = std::move(pending_reasoning);
      pending_reasoning.reset();
      conversation.messages.push_back(std::move(m));
    } else if (type == "function_call") {
      ToolCall call;
      auto call_id = get_string(item, "call_id", path + ".call_id");
      auto name = get_string(item, "name", path + ".name");
      auto arguments = get_string(item, "arguments", path + ".arguments");
      if (!call_id) reject(path + ".call_id", "Missing required parameter: '" + path + ".call_id'.");
      if (!name || name->empty()) reject(path + ".name", "Missing required parameter: '" + path + ".name'.");
      call.id = *call_id;
      call.name = *name;
      call.arguments_json = arguments.value_or("{}");
      Message& m = assistant_for_calls(conversation);
      if (pending_reasoning) m.reasoning_content = std::move(pending_reasoning);
      pending_reasoning.reset();
      m.tool_calls.push_back(std::move(call));
    } else if (type == "function_call_output") {
      auto call_id = get_string(item, "call_id", path + ".call_id");
      if (!call_id) reject(path + ".call_id", "Missing required parameter: '" + path + ".call_id'.");
      const json* output = find_field(item, "output");
      if (!output) reject(path + ".output", "Missing required parameter: '" + path + ".output'.");
      Message m;
      m.role = Role::kTool;
      m.tool_call_id = *call_id;
      m.content = flatten_text_content(*output, path + ".output", kInputTextParts);
      conversation.messages.push_back(std::move(m));
    } else if (type == "reasoning") {
      // Earlier reasoning goes back to the template, which decides whether to keep it.
      std::string text;
      if (const json* content = find_field(item, "content")) {
        text = flatten_text_content(*content, path + ".content", {"reasoning_text", "text"});
      } else if (const json* summary = find_field(item, "summary")) {
        text = flatten_text_content(*summary, path + ".summary", {"summary_text", "text"});
      }
      pending_reasoning = text;
    } else {
      reject(path + ".type", "Invalid value for '" + path + ".type': '" + type +
                                 "'. Supported values are: 'message', 'function_call', 'function_call_output' and 'reasoning'.");
    }
  }
  bool has_turn = false;
  for (const auto& m : conversation.messages) has_turn = has_turn || m.role != Role::kSystem;
  if (!has_turn) reject("input", "Invalid 'input': no user or assistant items.");
}

void parse_tools(const json& body, ApiRequest& request) {
  if (const json* tools = find_field(body, "tools")) {
    if (!tools->is_array()) reject("tools", std::string("Invalid type for 'tools': expected an array, but got ") + json_type_name(*tools) + " instead.");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      std::string path = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) reject(path, "Invalid type for '" + path + "': expected an object.");
      auto type = get_string(t, "type", path + ".type");
      if (!type) reject(path + ".type", "Missing required parameter: '" + path + ".type'.");
      if (*type != "function") reject(path + ".type", "Invalid value for '" + path + ".type': only 'function' tools are supported.");
      auto name = get_string(t, "name", path + ".name");
      if (!name || name->empty()) reject(path + ".name", "Missing required parameter: '" + path + ".name'.");
      ToolDefinition def;
      def.name = *name;
      def.description = get_string(t, "description", path + ".description").value_or("");
      def.parameters_json = schema_text(find_field(t, "parameters"), path + ".parameters");
      request.conversation.tools.push_back(std::move(def));
    }
  }
  if (const json* v = find_field(body, "tool_choice")) {
    if (v->is_string()) {
      std::string s = v->get<std::string>();
      if (s == "auto") request.tool_choice.mode = ToolChoiceMode::kAuto;
      else if (s == "none") request.tool_choice.mode = ToolChoiceMode::kNone;
      else if (s == "required") request.tool_choice.mode = ToolChoiceMode::kRequired;
      else reject("tool_choice", "Invalid value for 'tool_choice': '" + s + "'. Supported values are: 'none', 'auto' and 'required'.");
    } else if (v->is_object()) {
      auto name = get_string(*v, "name", "tool_choice.name");
      if (!name) reject("tool_choice.name", "Missing required parameter: 'tool_choice.name'.");
      request.tool_choice = {ToolChoiceMode::kNamed, *name};
    } else {
      reject("tool_choice", std::string("Invalid type for 'tool_choice': expected a string or an object, but got ") + json_type_name(*v) + " instead.");
    }
  }
  check_tool_choice(request.tool_choice, request.conversation, "tool_choice");
}

// `include: ["message.output_text.logprobs"]` asks for the output text's logprobs, `top_logprobs`
// (0..20) for that many alternatives per token. Other include values name outputs this server
// does not make (file search results, encrypted reasoning): accepted, nothing to add.
void parse_logprobs(const json& body, ApiRequest& request) {
  if (const json* include = find_field(body, "include")) {
    if (!include->is_array()) {
      reject("include", std::string("Invalid type for 'include': expected an array, but got ") +
                            json_type_name(*include) + " instead.");
    }
    for (size_t i = 0; i < include->size(); ++i) {
      const json& value = (*include)[i];
      const std::string path = "include[" + std::to_string(i) + "]";
      if (!value.is_string()) {
        reject(path, "Invalid type for '" + path + "': expected a string, but got " + json_type_name(value) +
                         " instead.");
      }
      if (value.get<std::string>() == "message.output_text.logprobs") request.sampling.logprobs = true;
    }
  }
  if (auto top = get_integer(body, "top_logprobs", "top_logprobs", 0, 20)) {
    request.sampling.num_logprobs = static_cast<int>(*top);
  }
}

}  // namespace

Result<ApiRequest> parse_responses_request(std::string_view body_text, std::string* error_param) {
  return run_parser(
      [&]() -> ApiRequest {
        json body = parse_body_object(body_text);
        ApiRequest request;
        request.protocol = ApiProtocol::kResponses;
        auto model = get_string(body, "model", "model");
        if (!model) reject("model", "Missing required parameter: 'model'.");
        request.model = *model;
        if (find_field(body, "previous_response_id")) {
          reject("previous_response_id", "Unsupported parameter: 'previous_response_id' (this server stores no responses; send the whole input).");
        }
        parse_input(body, request);
        parse_tools(body, request);
        read_sampling_fields(body, request.sampling);
        parse_logprobs(body, request);
        request.stream = get_bool(body, "stream", "stream").value_or(false);
        get_bool(body, "store", "store");
        if (auto max_tokens = read_max_tokens(body, "max_output_tokens")) {
          request.sampling.max_tokens = *max_tokens;
          request.max_tokens_given = true;
        }
        if (const json* text = find_field(body, "text")) {
          if (!text->is_object()) reject("text", "Invalid type for 'text': expected an object.");
          if (const json* format = find_field(*text, "format")) {
            if (!format->is_object()) reject("text.format", "Invalid type for 'text.format': expected an object.");
            auto type = get_string(*format, "type", "text.format.type").value_or("text");
            if (type == "json_object" || type == "json_schema") request.json_object = true;
            else if (type != "text") reject("text.format.type", "Invalid value for 'text.format.type': '" + type + "'.");
          }
        }
        if (const json* reasoning = find_field(body, "reasoning")) {
          if (!reasoning->is_object()) reject("reasoning", "Invalid type for 'reasoning': expected an object.");
          if (auto effort = get_string(*reasoning, "effort", "reasoning.effort")) {
            request.thinking = *effort != "none" && *effort != "minimal";
          }
        }
        if (const json* t = find_field(body, "thinking")) {
          if (t->is_boolean()) request.thinking = t->get<bool>();
          else if (t->is_object()) request.thinking = get_string(*t, "type", "thinking.type").value_or("enabled") == "enabled";
          else reject("thinking", "Invalid type for 'thinking': expected an object.");
        }
        return request;
      },
      error_param);
}

// ---------------------------------------------------------------------------------------------

namespace {

enum class ItemKind { kReasoning, kMessage, kFunctionCall };

struct OutputItem {
  ItemKind kind;
  std::string id;
  std::string text;  // reasoning text, message text, or call arguments
  std::string call_id;
  std::string name;
  bool done = false;
  json logprobs = json::array();  // a message's tokens' entries, when the request asked for them
};

class ResponsesEncoder : public ProtocolEncoder {
 public:
  explicit ResponsesEncoder(EncoderOptions options) : options_(std::move(options)) {}

  void begin(std::string& out) override {
    if (!options_.stream) return;
    json r = response_json("in_progress", nullptr);
    emit("response.created", {{"response", r}}, out);
    emit("response.in_progress", {{"response", r}}, out);
  }

  void on_event(int, const OutputEvent& event, std::string& out) override {
    switch (event.kind) {
      case OutputEventKind::kReasoning:
        if (event.text.empty()) return;
        open_item(ItemKind::kReasoning, out);
        items_.back().text += event.text;
        if (options_.stream) {
          emit("response.reasoning_text.delta",
               {{"item_id", items_.back().id}, {"output_index", items_.size() - 1}, {"content_index", 0}, {"delta", event.text}}, out);
        }
        break;
      case OutputEventKind::kContent:
        if (event.text.empty()) return;
        open_item(ItemKind::kMessage, out);
        items_.back().text += event.text;
        for (const json& entry : pending_logprobs_) items_.back().logprobs.push_back(entry);
        if (options_.stream) {
          emit("response.output_text.delta",
               {{"item_id", items_.back().id}, {"output_index", items_.size() - 1}, {"content_index", 0},
                {"delta", event.text}, {"logprobs", std::move(pending_logprobs_)}}, out);
        }
        pending_logprobs_ = json::array();
        break;
      case OutputEventKind::kToolCallBegin: {
        close_open_item(out);
        OutputItem item{ItemKind::kFunctionCall, item_id("fc"), "", "", event.text};
        item.call_id = "call_" + tail() + "_" + std::to_string(event.tool_index);
        items_.push_back(item);
        if (options_.stream) emit("response.output_item.added", {{"output_index", items_.size() - 1}, {"item", item_json(items_.back())}}, out);
        break;
      }
      case OutputEventKind::kToolCallArgs:
        if (items_.empty() || items_.back().kind != ItemKind::kFunctionCall || items_.back().done) return;
        items_.back().text += event.text;
        if (options_.stream && !event.text.empty()) {
          emit("response.function_call_arguments.delta",
               {{"item_id", items_.back().id}, {"output_index", items_.size() - 1}, {"delta", event.text}}, out);
        }
        break;
      case OutputEventKind::kToolCallEnd:
        close_open_item(out);
        break;
      case OutputEventKind::kStop:
        break;
    }
  }

  void on_logprobs(int, std::vector<TokenLogprobs> tokens) override {
    if (!options_.logprobs) return;
    for (const TokenLogprobs& t : tokens) pending_logprobs_.push_back(openai_logprob_json(t));
  }

  void end_choice(int, ChoiceEnd end, const std::string&, std::string& out) override {
    close_open_item(out);
    end_ = end;
  }

  void end(const UsageCounts& usage, std::string& out) override {
    json u = {{"input_tokens", usage.prompt_tokens},
              {"input_tokens_details", {{"cached_tokens", usage.cached_prompt_tokens}}},
              {"output_tokens", usage.completion_tokens},
              {"output_tokens_details", {{"reasoning_tokens", usage.reasoning_tokens}}},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
    bool incomplete = end_ == ChoiceEnd::kLength || end_ == ChoiceEnd::kCancelled;
    bool failed = end_ == ChoiceEnd::kError;
    const char* status = failed ? "failed" : incomplete ? "incomplete" : "completed";
    json r = response_json(status, u);
    if (end_ == ChoiceEnd::kLength) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    if (failed) r["error"] = {{"code", "server_error"}, {"message", "the engine failed while generating"}};
    if (!options_.stream) {
      out += dump(r);
      return;
    }
    emit(failed ? "response.failed" : incomplete ? "response.incomplete" : "response.completed", {{"response", r}}, out);
  }

  void stream_error(const ApiError& error, std::string& out) override {
    emit("error", {{"code", error.code.empty() ? json(nullptr) : json(error.code)}, {"message", error.message}, {"param", nullptr}}, out);
  }

 private:
  std::string tail() const { return options_.response_id.substr(options_.response_id.find('_') + 1); }
  std::string item_id(const char* prefix) const { return std::string(prefix) + "_" + tail() + "_" + std::to_string(items_.size()); }

  void emit(const char* type, json event, std::string& out) {
    event["type"] = type;
    event["sequence_number"] = sequence_number_++;
    append_sse(out, type, dump(event));
  }

  json item_json(const OutputItem& item) const {
    const char* status = item.done ? "completed" : "in_progress";
    switch (item.kind) {
      case ItemKind::kReasoning:
        return {{"id", item.id}, {"type", "reasoning"}, {"summary", json::array()},
                {"content", item.done ? json::array({{{"type", "reasoning_text"}, {"text", item.text}}}) : json::array()}};
      case ItemKind::kMessage:
        return {{"id", item.id}, {"type", "message"}, {"status", status}, {"role", "assistant"},
                {"content", item.done ? json::array({text_part(item.text, item.logprobs)}) : json::array()}};
      case ItemKind::kFunctionCall:
        return {{"id", item.id}, {"type", "function_call"}, {"status", status}, {"call_id", item.call_id},
                {"name", item.name}, {"arguments", item.text}};
    }
    return json::object();
  }

  static json text_part(const std::string& text, json logprobs = json::array()) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", std::move(logprobs)}};
  }

  void open_item(ItemKind kind, std::string& out) {
    if (!items_.empty() && !items_.back().done && items_.back().kind == kind) return;
    close_open_item(out);
    items_.push_back({kind, item_id(kind == ItemKind::kReasoning ? "rs" : "msg"), "", "", ""});
    if (!options_.stream) return;
    size_t index = items_.size() - 1;
    emit("response.output_item.added", {{"output_index", index}, {"item", item_json(items_.back())}}, out);
    json part = kind == ItemKind::kReasoning ? json{{"type", "reasoning_text"}, {"text", ""}} : text_part("");
    emit("response.content_part.added", {{"item_id", items_.back().id}, {"output_index", index}, {"content_index", 0}, {"part", part}}, out);
  }

  void close_open_item(std::string& out) {
    if (items_.empty() || items_.back().done) return;
    OutputItem& item = items_.back();
    item.done = true;
    if (!options_.stream) return;
    size_t index = items_.size() - 1;
    json ids = {{"item_id", item.id}, {"output_index", index}};
    if (item.kind == ItemKind::kReasoning) {
      json e = ids;
      e["content_index"] = 0;
      e["text"] = item.text;
      emit("response.reasoning_text.done", e, out);
      e.erase("text");
      e["part"] = {{"type", "reasoning_text"}, {"text", item.text}};
      emit("response.content_part.done", e, out);
    } else if (item.kind == ItemKind::kMessage) {
      json e = ids;
      e["content_index"] = 0;
      e["text"] = item.text;
      e["logprobs"] = item.logprobs;
      emit("response.output_text.done", e, out);
      e.erase("text");
      e.erase("logprobs");
      e["part"] = text_part(item.text, item.logprobs);
      emit("response.content_part.done", e, out);
    } else {
      json e = ids;
      e["arguments"] = item.text;
      e["name"] = item.name;
      emit("response.function_call_arguments.done", e, out);
    }
    emit("response.output_item.done", {{"output_index", index}, {"item", item_json(item)}}, out);
  }

  json response_json(const char* status, json usage) const {
    json output = json::array();
    for (const auto& item : items_) output.push_back(item_json(item));
    json r = {{"id", options_.response_id},
              {"object", "response"},
              {"created_at", options_.created_s},
              {"status", status},
              {"error", nullptr},
              {"incomplete_details", nullptr},
              {"model", options_.model},
              {"output", output},
              {"parallel_tool_calls", true},
              {"tool_choice", "auto"},
              {"tools", json::array()},
              {"usage", std::move(usage)}};
    std::string text;
    for (const auto& item : items_) {
      if (item.kind == ItemKind::kMessage) text += item.text;
    }
    r["output_text"] = text;
    return r;
  }

  EncoderOptions options_;
  std::vector<OutputItem> items_;
  json pending_logprobs_ = json::array();  // entries of the tokens the next content event brings
  ChoiceEnd end_ = ChoiceEnd::kEndOfTurn;
  int64_t sequence_number_ = 0;
};

}  // namespace

std::unique_ptr<ProtocolEncoder> make_responses_encoder(EncoderOptions options) {
  return std::make_unique<ResponsesEncoder>(std::move(options));
}

}  // namespace dsinfer::codec
