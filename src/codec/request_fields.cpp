// Field validation shared by the protocol adapters. The messages follow OpenAI's wording
// ("Invalid type for 'x': expected a number, but got a string instead.") so that clients which
// surface them read naturally.
#include "codec/request_fields.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace dsinfer::codec {

namespace {

// JSON nested deeper than this is rejected before parsing: nlohmann's serializer recurses, and
// no API body needs more than a few levels (tool schemas included).
constexpr int kMaxNestingDepth = 64;

bool nesting_within_limit(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > kMaxNestingDepth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

}  // namespace

void reject(const std::string& param, const std::string& message) { throw FieldError{param, message}; }

const char* json_type_name(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "an integer";
    case nlohmann::json::value_t::number_float: return "a number";
    default: return "an unsupported value";
  }
}

static void type_error(const std::string& path, const char* expected, const nlohmann::json& got) {
  reject(path, "Invalid type for '" + path + "': expected " + expected + ", but got " +
                   json_type_name(got) + " instead.");
}

nlohmann::json parse_body_object(std::string_view body) {
  if (body.empty()) reject("", "The request body is empty; expected a JSON object.");
  if (!nesting_within_limit(body)) {
    reject("", "The request body is nested more than " + std::to_string(kMaxNestingDepth) + " levels deep.");
  }
  nlohmann::json parsed = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    reject("", "We could not parse the JSON body of your request (malformed JSON or invalid UTF-8).");
  }
  if (!parsed.is_object()) reject("", std::string("The request body must be a JSON object, not ") + json_type_name(parsed) + ".");
  return parsed;
}

const nlohmann::json* find_field(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<std::string> get_string(const nlohmann::json& object, const char* key, const std::string& path) {
  const nlohmann::json* v = find_field(object, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) type_error(path, "a string", *v);
  return v->get<std::string>();
}

std::optional<bool> get_bool(const nlohmann::json& object, const char* key, const std::string& path) {
  const nlohmann::json* v = find_field(object, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) type_error(path, "a boolean", *v);
  return v->get<bool>();
}

std::optional<double> get_number(const nlohmann::json& object, const char* key, const std::string& path,
                                 double min_value, double max_value) {
  const nlohmann::json* v = find_field(object, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) type_error(path, "a number", *v);
  double x = v->get<double>();
  if (!std::isfinite(x) || x < min_value || x > max_value) {
    reject(path, "Invalid '" + path + "': " + v->dump() + " is out of range; expected a value in [" +
                     nlohmann::json(min_value).dump() + ", " + nlohmann::json(max_value).dump() + "].");
  }
  return x;
}

std::optional<int64_t> get_integer(const nlohmann::json& object, const char* key, const std::string& path,
                                   int64_t min_value, int64_t max_value) {
  const nlohmann::json* v = find_field(object, key);
  if (!v) return std::nullopt;
  bool integral = v->is_number_integer() || v->is_number_unsigned() ||
                  (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>());
  if (!integral) type_error(path, "an integer", *v);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    reject(path, "Invalid '" + path + "': " + v->dump() + " is too large.");
  }
  double as_double = v->get<double>();
  if (as_double < static_cast<double>(min_value) || as_double > static_cast<double>(max_value)) {
    reject(path, "Invalid '" + path + "': " + v->dump() + " is out of range; expected an integer in [" +
                     std::to_string(min_value) + ", " + std::to_string(max_value) + "].");
  }
  return v->is_number_float() ? static_cast<int64_t>(as_double) : v->get<int64_t>();
}

void read_sampling_fields(const nlohmann::json& body, SamplingParams& sampling) {
  if (auto t = get_number(body, "temperature", "temperature", 0.0, 2.0)) sampling.temperature = static_cast<float>(*t);
  if (auto p = get_number(body, "top_p", "top_p", 0.0, 1.0)) {
    if (*p <= 0.0) reject("top_p", "Invalid 'top_p': must be greater than 0.");
    sampling.top_p = static_cast<float>(*p);
  }
  // -1 is how vLLM and SGLang spell "disabled"; accept it.
  if (auto k = get_integer(body, "top_k", "top_k", -1, 1 << 20)) sampling.top_k = *k < 0 ? 0 : static_cast<int>(*k);
  if (auto m = get_number(body, "min_p", "min_p", 0.0, 1.0)) sampling.min_p = static_cast<float>(*m);
  if (const nlohmann::json* s = find_field(body, "seed")) {
    if (!(s->is_number_integer() || s->is_number_unsigned())) type_error("seed", "an integer", *s);
    sampling.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
}

void read_penalties(const nlohmann::json& body, SamplingParams& sampling) {
  if (auto p = get_number(body, "presence_penalty", "presence_penalty", -2.0, 2.0))
    sampling.presence_penalty = static_cast<float>(*p);
  if (auto f = get_number(body, "frequency_penalty", "frequency_penalty", -2.0, 2.0))
    sampling.frequency_penalty = static_cast<float>(*f);
  if (auto r = get_number(body, "repetition_penalty", "repetition_penalty", 0.0, 2.0)) {
    if (*r <= 0.0) reject("repetition_penalty", "Invalid 'repetition_penalty': must be greater than 0.");
    sampling.repetition_penalty = static_cast<float>(*r);
  }
  const nlohmann::json* bias = find_field(body, "logit_bias");
  if (!bias) return;
  if (!bias->is_object()) type_error("logit_bias", "an object", *bias);
  if (bias->size() > static_cast<size_t>(kMaxLogitBias))
    reject("logit_bias", "Invalid 'logit_bias': more than " + std::to_string(kMaxLogitBias) + " tokens.");
  for (const auto& [key, value] : bias->items()) {
    const std::string path = "logit_bias." + key;
    // The key is a token id written as a decimal string.
    int64_t id = -1;
    const auto [rest, error] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (error != std::errc() || rest != key.data() + key.size() || id < 0 || id > std::numeric_limits<int32_t>::max())
      reject("logit_bias", "Invalid 'logit_bias': key '" + key + "' is not a token id.");
    if (!value.is_number()) type_error(path, "a number", value);
    const double b = value.get<double>();
    if (!(b >= -100.0 && b <= 100.0))
      reject(path, "Invalid '" + path + "': " + value.dump() + " is out of range; expected a number in [-100, 100].");
    sampling.logit_bias.emplace_back(static_cast<TokenId>(id), static_cast<float>(b));
  }
}

std::vector<std::string> read_stop_strings(const nlohmann::json& body, const char* key) {
  std::vector<std::string> stops;
  const nlohmann::json* v = find_field(body, key);
  if (!v) return stops;
  if (v->is_string()) {
    stops.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > static_cast<size_t>(kMaxStopStrings)) {
      reject(key, std::string("Invalid '") + key + "': at most " + std::to_string(kMaxStopStrings) + " stop sequences are allowed.");
    }
    for (size_t i = 0; i < v->size(); ++i) {
      const auto& s = (*v)[i];
      if (!s.is_string()) type_error(std::string(key) + "[" + std::to_string(i) + "]", "a string", s);
      stops.push_back(s.get<std::string>());
    }
  } else {
    type_error(key, "a string or an array of strings", *v);
  }
  for (const auto& s : stops) {
    if (s.empty()) reject(key, std::string("Invalid '") + key + "': stop sequences must not be empty.");
  }
  return stops;
}

std::optional<int> read_max_tokens(const nlohmann::json& body, const char* key) {
  auto v = get_integer(body, key, key, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  if (!v) return std::nullopt;
  if (*v < 1) reject(key, std::string("Invalid '") + key + "': " + std::to_string(*v) + " is less than the minimum of 1.");
  return static_cast<int>(std::min<int64_t>(*v, std::numeric_limits<int>::max()));
}

std::string flatten_text_content(const nlohmann::json& content, const std::string& path,
                                 const std::vector<std::string>& text_types) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array()) type_error(path, "a string or an array of content parts", content);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const auto& part = content[i];
    std::string part_path = path + "[" + std::to_string(i) + "]";
    if (!part.is_object()) type_error(part_path, "an object", part);
    auto type = get_string(part, "type", part_path + ".type");
    if (!type) reject(part_path + ".type", "Missing required parameter: '" + part_path + ".type'.");
    bool is_text = false;
    for (const auto& t : text_types) is_text = is_text || *type == t;
    if (!is_text) {
      reject(part_path + ".type", "Unsupported content part type '" + *type + "' in '" + part_path +
                                      "': this server accepts text only.");
    }
    auto part_text = get_string(part, "text", part_path + ".text");
    if (!part_text) reject(part_path + ".text", "Missing required parameter: '" + part_path + ".text'.");
    text += *part_text;
  }
  return text;
}

std::string schema_text(const nlohmann::json* schema, const std::string& path) {
  if (!schema) return "{}";
  if (!schema->is_object()) type_error(path, "an object", *schema);
  return schema->dump();
}

void check_tool_choice(const ToolChoice& choice, const Conversation& conversation, const std::string& path) {
  if (choice.mode == ToolChoiceMode::kRequired && conversation.tools.empty()) {
    reject(path, "Invalid '" + path + "': tool_choice requires tools, but none were given.");
  }
  if (choice.mode != ToolChoiceMode::kNamed) return;
  for (const auto& tool : conversation.tools) {
    if (tool.name == choice.name) return;
  }
  reject(path, "Invalid '" + path + "': the tool '" + choice.name + "' is not among the tools given.");
}

// ---- error bodies ----

std::string error_type_for_status(ApiProtocol protocol, int http_status) {
  bool anthropic = protocol == ApiProtocol::kMessages;
  switch (http_status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return anthropic ? "request_too_large" : "invalid_request_error";
    case 429: return anthropic ? "rate_limit_error" : "rate_limit_exceeded";
    case 503: return anthropic ? "overloaded_error" : "service_unavailable";
    default: return anthropic ? "api_error" : "server_error";
  }
}

std::string error_body(ApiProtocol protocol, const ApiError& error) {
  nlohmann::json body;
  std::string type = error_type_for_status(protocol, error.http_status);
  if (protocol == ApiProtocol::kMessages) {
    body = {{"type", "error"}, {"error", {{"type", type}, {"message", error.message}}}};
  } else {
    body = {{"error",
             {{"message", error.message},
              {"type", type},
              {"param", error.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.param)},
              {"code", error.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.code)}}}};
  }
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace dsinfer::codec
