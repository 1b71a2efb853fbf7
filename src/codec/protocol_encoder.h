// Turns one request's parsed model output (OutputEvents, per choice) into a protocol's answer:
// Server-Sent Events frames while streaming, or one JSON body at the end. One implementation
// per protocol (openai_chat_protocol, openai_responses_protocol, anthropic_messages_protocol).
//
// Call order: begin, then any interleaving of on_event/on_logprobs/end_choice for choices
// 0..n-1 (each choice's events end with one end_choice), then end. Every call appends what must
// be written to the client to `out` (streaming: whole SSE frames; non-streaming: nothing until
// end, which appends the JSON body). An encoder is used from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "codec/api_request.h"
#include "codec/output_event.h"
#include "codec/token_logprobs.h"

namespace dsinfer::codec {

enum class ChoiceEnd {
  kEndOfTurn,   // the model ended its turn (eos); a turn with tool calls reports tool calls
  kStopString,  // a stop string matched (given to end_choice as `stop_string`)
  kLength,      // the token limit was reached
  kCancelled,   // the server cancelled it (shutdown)
  kError,       // the engine failed
};

struct UsageCounts {
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;
  int completion_tokens = 0;  // all choices
  int reasoning_tokens = 0;   // part of completion_tokens
};

struct EncoderOptions {
  std::string response_id;  // "chatcmpl-…", "resp_…", "msg_…"
  std::string model;
  int64_t created_s = 0;
  bool stream = false;
  bool include_usage = false;  // Chat/Completions streaming: a final usage chunk
  int num_choices = 1;
  int num_prompt_tokens = 0;  // known before generation (Messages reports it in message_start)
  int num_cached_prompt_tokens = 0;
  std::string echo_prompt;  // Completions with echo: the prompt text prefixed to choice text
  bool logprobs = false;    // Chat Completions / Completions: the request asked for logprobs
};

class ProtocolEncoder {
 public:
  virtual ~ProtocolEncoder() = default;
  virtual void begin(std::string& out) = 0;
  virtual void on_event(int choice, const OutputEvent& event, std::string& out) = 0;
  // The log-probabilities of the tokens whose text the choice's next content event carries
  // (called just before it), when the request asked for them. Only the OpenAI Chat Completions
  // and Completions encoders report them.
  virtual void on_logprobs(int choice, std::vector<TokenLogprobs> tokens) {}
  virtual void end_choice(int choice, ChoiceEnd end, const std::string& stop_string, std::string& out) = 0;
  virtual void end(const UsageCounts& usage, std::string& out) = 0;
  // A streaming failure after the first bytes went out (the HTTP status is already sent).
  virtual void stream_error(const ApiError& error, std::string& out) = 0;
};

std::unique_ptr<ProtocolEncoder> make_protocol_encoder(ApiProtocol protocol, EncoderOptions options);

// One SSE frame: optional "event:" line, the data line(s), blank line.
void append_sse(std::string& out, const char* event_name, const std::string& data);

}  // namespace dsinfer::codec
