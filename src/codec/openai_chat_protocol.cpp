// OpenAI Chat Completions and Completions: parsing into ApiRequest, and the chunk/JSON encoders.
#include "codec/openai_chat_protocol.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "codec/logprobs_json.h"
#include "codec/request_fields.h"

namespace dsinfer::codec {

using nlohmann::json;

namespace {

constexpr int kMaxChoices = 16;
// Alternatives per token (OpenAI's top_logprobs limit, and the engine's).
constexpr int kMaxTopLogprobs = 20;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const std::vector<std::string> kChatTextParts = {"text", "input_text", "output_text"};

Role parse_role(const std::string& role, const std::string& path) {
  if (role == "system" || role == "developer") return Role::kSystem;
  if (role == "user") return Role::kUser;
  if (role == "assistant") return Role::kAssistant;
  if (role == "tool") return Role::kTool;
  reject(path, "Invalid value for '" + path + "': '" + role +
                   "'. Supported values are: 'system', 'developer', 'user', 'assistant' and 'tool'.");
}

std::vector<ToolCall> parse_tool_calls(const json& calls, const std::string& path) {
  if (!calls.is_array()) reject(path, "Invalid type for '" + path + "': expected an array, but got " + json_type_name(calls) + " instead.");
  std::vector<ToolCall> out;
  for (size_t i = 0; i < calls.size(); ++i) {
    const json& c = calls[i];
    std::string p = path + "[" + std::to_string(i) + "]";
    if (!c.is_object()) reject(p, "Invalid type for '" + p + "': expected an object.");
    const json* fn = find_field(c, "function");
    if (!fn || !fn->is_object()) reject(p + ".function", "Missing required parameter: '" + p + ".function'.");
    ToolCall call;
    call.id = get_string(c, "id", p + ".id").value_or("call_" + std::to_string(i));
    auto name = get_string(*fn, "name", p + ".function.name");
    if (!name || name->empty()) reject(p + ".function.name", "Missing required parameter: '" + p + ".function.name'.");
    call.name = *name;
    const json* args = find_field(*fn, "arguments");
    if (!args) call.arguments_json = "{}";
    else if (args->is_string()) call.arguments_json = args->get<std::string>();
    else if (args->is_object()) call.arguments_json = dump(*args);
    else reject(p + ".function.arguments", "Invalid type for '" + p + ".function.arguments': expected a string.");
    out.push_back(std::move(call));
  }
  return out;
}

void parse_messages(const json& body, Conversation& conversation) {
  const json* messages = find_field(body, "messages");
  if (!messages) reject("messages", "Missing required parameter: 'messages'.");
  if (!messages->is_array()) reject("messages", std::string("Invalid type for 'messages': expected an array, but got ") + json_type_name(*messages) + " instead.");
  if (messages->empty()) reject("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1.");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    std::string path = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) reject(path, "Invalid type for '" + path + "': expected an object, but got " + json_type_name(m) + " instead.");
    auto role = get_string(m, "role", path + ".role");
    if (!role) reject(path + ".role", "Missing required parameter: '" + path + ".role'.");
    Message message;
    message.role = parse_role(*role, path + ".role");
    const json* content = find_field(m, "content");
    if (content) message.content = flatten_text_content(*content, path + ".content", kChatTextParts);
    if (message.role == Role::kAssistant) {
      if (auto r = get_string(m, "reasoning_content", path + ".reasoning_content")) message.reasoning_content = *r;
      if (const json* calls = find_field(m, "tool_calls")) message.tool_calls = parse_tool_calls(*calls, path + ".tool_calls");
      if (!content && message.tool_calls.empty() && !message.reasoning_content) {
        reject(path + ".content", "Missing required parameter: '" + path + ".content'.");
      }
    } else if (!content) {
      reject(path + ".content", "Missing required parameter: '" + path + ".content'.");
    }
    if (message.role == Role::kTool) {
      auto id = get_string(m, "tool_call_id", path + ".tool_call_id");
      if (!id) reject(path + ".tool_call_id", "Missing required parameter: '" + path + ".tool_call_id'.");
      message.tool_call_id = *id;
    }
    conversation.messages.push_back(std::move(message));
  }
}

void parse_tools(const json& body, Conversation& conversation) {
  const json* tools = find_field(body, "tools");
  if (!tools) return;
  if (!tools->is_array()) reject("tools", std::string("Invalid type for 'tools': expected an array, but got ") + json_type_name(*tools) + " instead.");
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    std::string path = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) reject(path, "Invalid type for '" + path + "': expected an object.");
    auto type = get_string(t, "type", path + ".type").value_or("function");
    if (type != "function") reject(path + ".type", "Invalid value for '" + path + ".type': only 'function' tools are supported.");
    const json* fn = find_field(t, "function");
    if (!fn || !fn->is_object()) reject(path + ".function", "Missing required parameter: '" + path + ".function'.");
    ToolDefinition def;
    auto name = get_string(*fn, "name", path + ".function.name");
    if (!name || name->empty()) reject(path + ".function.name", "Missing required parameter: '" + path + ".function.name'.");
    def.name = *name;
    def.description = get_string(*fn, "description", path + ".function.description").value_or("");
    def.parameters_json = schema_text(find_field(*fn, "parameters"), path + ".function.parameters");
    conversation.tools.push_back(std::move(def));
  }
}

ToolChoice parse_tool_choice(const json& body) {
  ToolChoice choice;
  const json* v = find_field(body, "tool_choice");
  if (!v) return choice;
  if (v->is_string()) {
    std::string s = v->get<std::string>();
    if (s == "auto") choice.mode = ToolChoiceMode::kAuto;
    else if (s == "none") choice.mode = ToolChoiceMode::kNone;
    else if (s == "required") choice.mode = ToolChoiceMode::kRequired;
    else reject("tool_choice", "Invalid value for 'tool_choice': '" + s + "'. Supported values are: 'none', 'auto' and 'required'.");
    return choice;
  }
  if (!v->is_object()) reject("tool_choice", std::string("Invalid type for 'tool_choice': expected a string or an object, but got ") + json_type_name(*v) + " instead.");
  const json* fn = find_field(*v, "function");
  auto name = fn && fn->is_object() ? get_string(*fn, "name", "tool_choice.function.name") : std::nullopt;
  if (!name) reject("tool_choice.function.name", "Missing required parameter: 'tool_choice.function.name'.");
  choice.mode = ToolChoiceMode::kNamed;
  choice.name = *name;
  return choice;
}

void parse_thinking(const json& body, ApiRequest& request) {
  if (const json* t = find_field(body, "thinking")) {
    if (t->is_boolean()) {
      request.thinking = t->get<bool>();
    } else if (t->is_object()) {
      auto type = get_string(*t, "type", "thinking.type");
      if (!type || (*type != "enabled" && *type != "disabled")) {
        reject("thinking.type", "Invalid value for 'thinking.type': expected 'enabled' or 'disabled'.");
      }
      request.thinking = *type == "enabled";
    } else {
      reject("thinking", std::string("Invalid type for 'thinking': expected an object, but got ") + json_type_name(*t) + " instead.");
    }
  }
  if (const json* kwargs = find_field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) reject("chat_template_kwargs", "Invalid type for 'chat_template_kwargs': expected an object.");
    if (auto b = get_bool(*kwargs, "thinking", "chat_template_kwargs.thinking")) request.thinking = *b;
  }
}

void parse_response_format(const json& body, ApiRequest& request) {
  const json* rf = find_field(body, "response_format");
  if (!rf) return;
  if (!rf->is_object()) reject("response_format", std::string("Invalid type for 'response_format': expected an object, but got ") + json_type_name(*rf) + " instead.");
  auto type = get_string(*rf, "type", "response_format.type");
  if (!type) reject("response_format.type", "Missing required parameter: 'response_format.type'.");
  if (*type == "json_object" || *type == "json_schema") request.json_object = true;
  else if (*type != "text") reject("response_format.type", "Invalid value for 'response_format.type': '" + *type + "'. Supported values are: 'text', 'json_object' and 'json_schema'.");
}

// Chat Completions: `logprobs` (bool) and `top_logprobs` (0..20, with logprobs only).
void parse_chat_logprobs(const json& body, ApiRequest& request) {
  const bool logprobs = get_bool(body, "logprobs", "logprobs").value_or(false);
  const auto top = get_integer(body, "top_logprobs", "top_logprobs", 0, kMaxTopLogprobs);
  if (top && !logprobs) {
    reject("top_logprobs", "Invalid value for 'top_logprobs': 'logprobs' must be true when 'top_logprobs' is given.");
  }
  request.sampling.logprobs = logprobs;
  request.sampling.num_logprobs = static_cast<int>(top.value_or(0));
}

void parse_common(const json& body, ApiRequest& request) {
  auto model = get_string(body, "model", "model");
  if (!model) reject("model", "Missing required parameter: 'model'.");
  request.model = *model;
  read_sampling_fields(body, request.sampling);
  read_penalties(body, request.sampling);
  if (auto n = get_integer(body, "n", "n", 1, kMaxChoices)) request.n = static_cast<int>(*n);
  request.stream = get_bool(body, "stream", "stream").value_or(false);
  if (const json* so = find_field(body, "stream_options")) {
    if (!so->is_object()) reject("stream_options", std::string("Invalid type for 'stream_options': expected an object, but got ") + json_type_name(*so) + " instead.");
    request.include_usage = get_bool(*so, "include_usage", "stream_options.include_usage").value_or(false);
  }
  request.stop = read_stop_strings(body, "stop");
  if (auto ignore = get_bool(body, "ignore_eos", "ignore_eos")) request.sampling.ignore_eos = *ignore;
}

}  // namespace

Result<ApiRequest> parse_chat_completions_request(std::string_view body_text, std::string* error_param) {
  return run_parser(
      [&]() -> ApiRequest {
        json body = parse_body_object(body_text);
        ApiRequest request;
        request.protocol = ApiProtocol::kChatCompletions;
        parse_common(body, request);
        parse_chat_logprobs(body, request);
        parse_messages(body, request.conversation);
        parse_tools(body, request.conversation);
        request.tool_choice = parse_tool_choice(body);
        check_tool_choice(request.tool_choice, request.conversation, "tool_choice");
        parse_thinking(body, request);
        parse_response_format(body, request);
        auto max_tokens = read_max_tokens(body, "max_tokens");
        auto max_completion = read_max_tokens(body, "max_completion_tokens");
        if (max_completion) max_tokens = max_completion;
        if (max_tokens) {
          request.sampling.max_tokens = *max_tokens;
          request.max_tokens_given = true;
        }
        return request;
      },
      error_param);
}

Result<ApiRequest> parse_completions_request(std::string_view body_text, std::string* error_param) {
  return run_parser(
      [&]() -> ApiRequest {
        json body = parse_body_object(body_text);
        ApiRequest request;
        request.protocol = ApiProtocol::kCompletions;
        request.raw_prompt = true;
        parse_common(body, request);
        const json* prompt = find_field(body, "prompt");
        if (!prompt) reject("prompt", "Missing required parameter: 'prompt'.");
        // One prompt per request: a string, a one-string array, token ids, or one id array.
        const json* p = prompt;
        if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
        if (p->is_string()) {
          request.prompt_text = p->get<std::string>();
          if (request.prompt_text.empty()) reject("prompt", "Invalid 'prompt': the prompt is empty.");
        } else if (p->is_array()) {
          if (p->empty()) reject("prompt", "Invalid 'prompt': the prompt is empty.");
          for (size_t i = 0; i < p->size(); ++i) {
            const json& id = (*p)[i];
            if (!id.is_number_integer() && !id.is_number_unsigned()) {
              reject("prompt", "Invalid 'prompt': expected a string, an array of token ids, or one of those in an array (batches of prompts are not supported).");
            }
            int64_t v = id.get<int64_t>();
            if (v < 0 || v > std::numeric_limits<int32_t>::max()) reject("prompt", "Invalid 'prompt': token id " + std::to_string(v) + " is out of range.");
            request.prompt_ids.push_back(static_cast<TokenId>(v));
          }
          request.has_prompt_ids = true;
        } else {
          reject("prompt", std::string("Invalid type for 'prompt': expected a string or an array of token ids, but got ") + json_type_name(*p) + " instead.");
        }
        if (find_field(body, "suffix")) reject("suffix", "Unsupported parameter: 'suffix' is not supported by this server.");
        request.echo = get_bool(body, "echo", "echo").value_or(false);
        // Completions: `logprobs` is the number of alternatives per token (0: the token's own).
        if (auto top = get_integer(body, "logprobs", "logprobs", 0, kMaxTopLogprobs)) {
          if (request.echo) {
            reject("logprobs", "Unsupported: 'logprobs' with 'echo' asks for the prompt's log-probabilities, "
                               "which this server does not compute.");
          }
          request.sampling.logprobs = true;
          request.sampling.num_logprobs = static_cast<int>(*top);
        }
        // OpenAI's Completions default is 16 tokens.
        request.sampling.max_tokens = 16;
        if (auto max_tokens = read_max_tokens(body, "max_tokens")) request.sampling.max_tokens = *max_tokens;
        request.max_tokens_given = true;
        return request;
      },
      error_param);
}

// ---------------------------------------------------------------------------------------------
// Encoders

namespace {

json usage_json(const UsageCounts& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
          // DeepSeek's own spelling of the same numbers.
          {"prompt_cache_hit_tokens", u.cached_prompt_tokens},
          {"prompt_cache_miss_tokens", u.prompt_tokens - u.cached_prompt_tokens}};
}

struct ChoiceState {
  std::string content;
  std::string reasoning;
  bool has_reasoning = false;
  std::vector<ToolCall> tool_calls;
  std::string finish_reason;
  bool ended = false;
  // Chat Completions with logprobs: the content tokens' entries (streaming: those not sent yet).
  json logprobs = json::array();
};

json chat_logprobs_json(json content) { return {{"content", std::move(content)}, {"refusal", nullptr}}; }

// Characters (code points) in valid UTF-8 text: Completions' text_offset counts them.
int64_t num_code_points(const std::string& text) {
  int64_t n = 0;
  for (unsigned char b : text) n += (b & 0xC0) != 0x80;
  return n;
}

// Completions' logprobs object, its four lists one entry per token.
struct TextLogprobs {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  int64_t next_offset = 0;  // characters of the choice's text before the next token (no echo
                            // with logprobs: the parser refuses it)

  bool empty() const { return tokens.empty(); }
  void add(const TokenLogprobs& token) {
    tokens.push_back(token.chosen.text);
    token_logprobs.push_back(reported_logprob(token.chosen.logprob));
    json top = json::object();
    // Tokens of the same text (parts of characters) share a key; the likeliest keeps it.
    for (const LogprobToken& alt : token.top)
      if (!top.contains(alt.text)) top[alt.text] = reported_logprob(alt.logprob);
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(next_offset);
    next_offset += num_code_points(token.chosen.text);
  }
  // The object, leaving the lists empty for the tokens after.
  json take() {
    json out = {{"tokens", std::move(tokens)},
                {"token_logprobs", std::move(token_logprobs)},
                {"top_logprobs", std::move(top_logprobs)},
                {"text_offset", std::move(text_offset)}};
    tokens = json::array();
    token_logprobs = json::array();
    top_logprobs = json::array();
    text_offset = json::array();
    return out;
  }
};

const char* finish_name(ChoiceEnd end, bool has_tool_calls) {
  switch (end) {
    case ChoiceEnd::kEndOfTurn: return has_tool_calls ? "tool_calls" : "stop";
    case ChoiceEnd::kStopString: return "stop";
    case ChoiceEnd::kLength: return "length";
    case ChoiceEnd::kCancelled: return "abort";
    case ChoiceEnd::kError: return "error";
  }
  return "stop";
}

class ChatCompletionsEncoder : public ProtocolEncoder {
 public:
  explicit ChatCompletionsEncoder(EncoderOptions options)
      : options_(std::move(options)), choices_(static_cast<size_t>(options_.num_choices)) {}

  void begin(std::string& out) override {
    if (!options_.stream) return;
    for (int i = 0; i < options_.num_choices; ++i) {
      emit_chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr, out);
    }
  }

  void on_event(int choice, const OutputEvent& event, std::string& out) override {
    ChoiceState& c = choices_.at(static_cast<size_t>(choice));
    switch (event.kind) {
      case OutputEventKind::kContent:
        c.content += event.text;
        if (!options_.stream || event.text.empty()) break;
        if (c.logprobs.empty()) emit_text_chunk(choice, "content", event.text, out);
        else emit_chunk(choice, {{"content", event.text}}, nullptr, out, take_logprobs(c));
        break;
      case OutputEventKind::kReasoning:
        c.reasoning += event.text;
        c.has_reasoning = true;
        if (options_.stream && !event.text.empty()) emit_text_chunk(choice, "reasoning_content", event.text, out);
        break;
      case OutputEventKind::kToolCallBegin: {
        ToolCall call;
        call.id = tool_call_id(choice, event.tool_index);
        call.name = event.text;
        c.tool_calls.push_back(call);
        if (options_.stream) {
          json tc = {{"index", event.tool_index},
                     {"id", call.id},
                     {"type", "function"},
                     {"function", {{"name", call.name}, {"arguments", ""}}}};
          emit_chunk(choice, {{"tool_calls", json::array({tc})}}, nullptr, out);
        }
        break;
      }
      case OutputEventKind::kToolCallArgs:
        if (!c.tool_calls.empty()) c.tool_calls.back().arguments_json += event.text;
        if (options_.stream && !event.text.empty()) {
          json tc = {{"index", event.tool_index}, {"function", {{"arguments", event.text}}}};
          emit_chunk(choice, {{"tool_calls", json::array({tc})}}, nullptr, out);
        }
        break;
      case OutputEventKind::kToolCallEnd:
      case OutputEventKind::kStop:
        break;
    }
  }

  void on_logprobs(int choice, std::vector<TokenLogprobs> tokens) override {
    if (!options_.logprobs) return;
    ChoiceState& c = choices_.at(static_cast<size_t>(choice));
    for (const TokenLogprobs& t : tokens) c.logprobs.push_back(openai_logprob_json(t));
  }

  void end_choice(int choice, ChoiceEnd end, const std::string&, std::string& out) override {
    ChoiceState& c = choices_.at(static_cast<size_t>(choice));
    c.finish_reason = finish_name(end, !c.tool_calls.empty());
    c.ended = true;
    // Entries whose text never reached a content chunk (none in practice) go with the last one.
    if (options_.stream) {
      emit_chunk(choice, json::object(), c.finish_reason.c_str(), out,
                 c.logprobs.empty() ? json(nullptr) : take_logprobs(c));
    }
  }

  void end(const UsageCounts& usage, std::string& out) override {
    if (options_.stream) {
      if (options_.include_usage) {
        json chunk = chunk_base();
        chunk["choices"] = json::array();
        chunk["usage"] = usage_json(usage);
        append_sse(out, nullptr, dump(chunk));
      }
      append_sse(out, nullptr, "[DONE]");
      return;
    }
    json body = {{"id", options_.response_id},
                 {"object", "chat.completion"},
                 {"created", options_.created_s},
                 {"model", options_.model},
                 {"system_fingerprint", nullptr}};
    json choices = json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const ChoiceState& c = choices_[i];
      json message = {{"role", "assistant"},
                      {"content", c.content.empty() && !c.tool_calls.empty() ? json(nullptr) : json(c.content)}};
      if (c.has_reasoning) message["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.empty()) {
        json calls = json::array();
        for (const auto& tc : c.tool_calls) {
          calls.push_back({{"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments_json}}}});
        }
        message["tool_calls"] = calls;
      }
      choices.push_back({{"index", i}, {"message", message},
                         {"logprobs", options_.logprobs ? chat_logprobs_json(c.logprobs) : json(nullptr)},
                         {"finish_reason", c.ended ? json(c.finish_reason) : json(nullptr)}});
    }
    body["choices"] = choices;
    body["usage"] = usage_json(usage);
    out += dump(body);
  }

  void stream_error(const ApiError& error, std::string& out) override {
    append_sse(out, nullptr, error_body(ApiProtocol::kChatCompletions, error));
  }

 private:
  json chunk_base() const {
    return {{"id", options_.response_id},
            {"object", "chat.completion.chunk"},
            {"created", options_.created_s},
            {"model", options_.model},
            {"system_fingerprint", nullptr}};
  }

  // The per-token hot path: the chunk is assembled from a cached prefix instead of a json tree.
  void emit_text_chunk(int choice, const char* field, const std::string& text, std::string& out) {
    if (text_prefix_.empty()) {
      text_prefix_ = "{\"id\":" + dump(json(options_.response_id)) + ",\"object\":\"chat.completion.chunk\",\"created\":" +
                     std::to_string(options_.created_s) + ",\"model\":" + dump(json(options_.model)) +
                     ",\"system_fingerprint\":null,\"choices\":[{\"index\":";
    }
    std::string data = text_prefix_;
    data += std::to_string(choice);
    data += ",\"delta\":{\"";
    data += field;
    data += "\":";
    data += dump(json(text));
    data += "},\"logprobs\":null,\"finish_reason\":null}]}";
    append_sse(out, nullptr, data);
  }

  void emit_chunk(int choice, json delta, const char* finish_reason, std::string& out, json logprobs = nullptr) {
    json chunk = chunk_base();
    chunk["choices"] = json::array({{{"index", choice},
                                     {"delta", std::move(delta)},
                                     {"logprobs", std::move(logprobs)},
                                     {"finish_reason", finish_reason ? json(finish_reason) : json(nullptr)}}});
    append_sse(out, nullptr, dump(chunk));
  }

  static json take_logprobs(ChoiceState& c) {
    json entries = std::move(c.logprobs);
    c.logprobs = json::array();
    return chat_logprobs_json(std::move(entries));
  }

  std::string tool_call_id(int choice, int tool_index) const {
    // Unique per response: the response id's random tail plus the position of the call.
    std::string tail = options_.response_id.substr(options_.response_id.find('-') + 1);
    return "call_" + tail + "_" + std::to_string(choice) + "_" + std::to_string(tool_index);
  }

  EncoderOptions options_;
  std::vector<ChoiceState> choices_;
  std::string text_prefix_;
};

class CompletionsEncoder : public ProtocolEncoder {
 public:
  explicit CompletionsEncoder(EncoderOptions options)
      : options_(std::move(options)),
        choices_(static_cast<size_t>(options_.num_choices)),
        logprobs_(static_cast<size_t>(options_.num_choices)) {}

  void begin(std::string& out) override {
    if (!options_.stream || options_.echo_prompt.empty()) return;
    for (int i = 0; i < options_.num_choices; ++i) emit(i, options_.echo_prompt, nullptr, out);
  }

  void on_event(int choice, const OutputEvent& event, std::string& out) override {
    // Raw completions have no reasoning or tool syntax: everything the model says is text.
    if (event.kind != OutputEventKind::kContent && event.kind != OutputEventKind::kReasoning) return;
    choices_.at(static_cast<size_t>(choice)).content += event.text;
    if (options_.stream && !event.text.empty()) emit(choice, event.text, nullptr, out);
  }

  void on_logprobs(int choice, std::vector<TokenLogprobs> tokens) override {
    if (!options_.logprobs) return;
    for (const TokenLogprobs& t : tokens) logprobs_.at(static_cast<size_t>(choice)).add(t);
  }

  void end_choice(int choice, ChoiceEnd end, const std::string&, std::string& out) override {
    ChoiceState& c = choices_.at(static_cast<size_t>(choice));
    c.finish_reason = finish_name(end, false);
    c.ended = true;
    if (options_.stream) emit(choice, "", c.finish_reason.c_str(), out);
  }

  void end(const UsageCounts& usage, std::string& out) override {
    if (options_.stream) {
      if (options_.include_usage) {
        json chunk = base();
        chunk["choices"] = json::array();
        chunk["usage"] = usage_json(usage);
        append_sse(out, nullptr, dump(chunk));
      }
      append_sse(out, nullptr, "[DONE]");
      return;
    }
    json body = base();
    json choices = json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      choices.push_back({{"index", i},
                         {"text", options_.echo_prompt + choices_[i].content},
                         {"logprobs", options_.logprobs ? logprobs_[i].take() : json(nullptr)},
                         {"finish_reason", choices_[i].ended ? json(choices_[i].finish_reason) : json(nullptr)}});
    }
    body["choices"] = choices;
    body["usage"] = usage_json(usage);
    out += dump(body);
  }

  void stream_error(const ApiError& error, std::string& out) override {
    append_sse(out, nullptr, error_body(ApiProtocol::kCompletions, error));
  }

 private:
  json base() const {
    return {{"id", options_.response_id}, {"object", "text_completion"}, {"created", options_.created_s}, {"model", options_.model}};
  }
  void emit(int choice, const std::string& text, const char* finish_reason, std::string& out) {
    // The tokens' entries go with the text they make (or, left over, with the finish chunk).
    TextLogprobs& logprobs = logprobs_.at(static_cast<size_t>(choice));
    if (!finish_reason && logprobs.empty()) {
      // The per-token hot path, from a cached prefix.
      if (text_prefix_.empty()) {
        text_prefix_ = "{\"id\":" + dump(json(options_.response_id)) + ",\"object\":\"text_completion\",\"created\":" +
                       std::to_string(options_.created_s) + ",\"model\":" + dump(json(options_.model)) + ",\"choices\":[{\"index\":";
      }
      std::string data = text_prefix_ + std::to_string(choice) + ",\"text\":" + dump(json(text)) +
                         ",\"logprobs\":null,\"finish_reason\":null}]}";
      append_sse(out, nullptr, data);
      return;
    }
    json chunk = base();
    chunk["choices"] = json::array({{{"index", choice}, {"text", text},
                                     {"logprobs", logprobs.empty() ? json(nullptr) : logprobs.take()},
                                     {"finish_reason", finish_reason ? json(finish_reason) : json(nullptr)}}});
    append_sse(out, nullptr, dump(chunk));
  }

  EncoderOptions options_;
  std::vector<ChoiceState> choices_;
  std::vector<TextLogprobs> logprobs_;  // per choice: all (non-streaming) or those not sent yet
  std::string text_prefix_;
};

}  // namespace

std::unique_ptr<ProtocolEncoder> make_chat_completions_encoder(EncoderOptions options) {
  return std::make_unique<ChatCompletionsEncoder>(std::move(options));
}

std::unique_ptr<ProtocolEncoder> make_completions_encoder(EncoderOptions options) {
  return std::make_unique<CompletionsEncoder>(std::move(options));
}

void append_sse(std::string& out, const char* event_name, const std::string& data) {
  if (event_name) {
    out += "event: ";
    out += event_name;
    out += '\n';
  }
  // JSON from dump() has no raw newlines; keep the general rule for arbitrary data anyway.
  size_t start = 0;
  while (true) {
    size_t nl = data.find('\n', start);
    out += "data: ";
    out.append(data, start, nl == std::string::npos ? std::string::npos : nl - start);
    out += '\n';
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  out += '\n';
}

}  // namespace dsinfer::codec
