// Typed access to the fields of a JSON request body, shared by the protocol adapters. Every
// getter validates the type and range and, on failure, returns an error naming the parameter,
// so each protocol reports `400 Invalid 'top_p': ...` the same way. Internal to src/codec.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "codec/api_request.h"
#include "core/status.h"

namespace dsinfer::codec {

// Why a field was rejected: the parameter's path and the message. Thrown inside the adapters
// and caught at their parse_* entry points, which turn it into Result errors.
struct FieldError {
  std::string param;
  std::string message;
};

[[noreturn]] void reject(const std::string& param, const std::string& message);

// Parses `body` as a JSON object, rejecting bad UTF-8, trailing data and non-objects.
nlohmann::json parse_body_object(std::string_view body);

const char* json_type_name(const nlohmann::json& value);

// Absent and null both read as "not given".
const nlohmann::json* find_field(const nlohmann::json& object, const char* key);

std::optional<std::string> get_string(const nlohmann::json& object, const char* key,
                                      const std::string& path);
std::optional<bool> get_bool(const nlohmann::json& object, const char* key, const std::string& path);
std::optional<double> get_number(const nlohmann::json& object, const char* key, const std::string& path,
                                 double min_value, double max_value);
std::optional<int64_t> get_integer(const nlohmann::json& object, const char* key, const std::string& path,
                                   int64_t min_value, int64_t max_value);

// temperature, top_p, top_k, seed, min_p into `sampling` (names as in OpenAI's API).
void read_sampling_fields(const nlohmann::json& body, SamplingParams& sampling);

// presence_penalty, frequency_penalty (OpenAI's, in [-2, 2]), repetition_penalty (vLLM's, in
// (0, 2]) and logit_bias ({"token id": bias in [-100, 100]}, at most kMaxLogitBias) into
// `sampling`.
void read_penalties(const nlohmann::json& body, SamplingParams& sampling);
inline constexpr int kMaxLogitBias = 1024;

// "stop" / "stop_sequences": a string or an array of strings (at most kMaxStopStrings).
std::vector<std::string> read_stop_strings(const nlohmann::json& body, const char* key);
inline constexpr int kMaxStopStrings = 16;

// A token limit: a positive integer. Huge values are accepted here and rejected against the
// context window later (context_length_exceeded).
std::optional<int> read_max_tokens(const nlohmann::json& body, const char* key);

// Concatenates the text of a content value: a string, or an array of parts whose text-bearing
// parts have one of `text_types` ("text", "input_text", ...). Other part types are rejected.
std::string flatten_text_content(const nlohmann::json& content, const std::string& path,
                                 const std::vector<std::string>& text_types);

// A tool's JSON schema as compact JSON text ("{}" when absent).
std::string schema_text(const nlohmann::json* schema, const std::string& path);

// Validates tool_choice against the declared tools (a named tool must exist).
void check_tool_choice(const ToolChoice& choice, const Conversation& conversation,
                       const std::string& path);

// Wraps a parse routine: FieldError and JSON errors become an InvalidArgument Result whose
// parameter is stored in *error_param.
template <typename Fn>
Result<ApiRequest> run_parser(Fn&& fn, std::string* error_param) {
  try {
    return fn();
  } catch (const FieldError& e) {
    if (error_param) *error_param = e.param;
    return Status(StatusCode::kInvalidArgument, e.message);
  } catch (const nlohmann::json::exception& e) {
    if (error_param) error_param->clear();
    return Status(StatusCode::kInvalidArgument, std::string("invalid request: ") + e.what());
  }
}

}  // namespace dsinfer::codec
