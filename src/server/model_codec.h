// What the HTTP server needs from the model's text side: conversation → prompt token ids,
// text ↔ ids, and per-request incremental decoding and output parsing. The DeepSeek
// implementation binds the tokenizer (src/tokenizer) and chat templates/output parser
// (src/codec); ByteCodec (byte_codec.h) is a self-contained one for the scripted echo engine.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "codec/conversation.h"
#include "codec/output_event.h"
#include "core/status.h"
#include "dsinfer/engine_types.h"

namespace dsinfer::server {

// Token ids → UTF-8 text, one id at a time; holds back incomplete UTF-8 sequences.
class TokenTextStream {
 public:
  virtual ~TokenTextStream() = default;
  virtual std::string push(TokenId id) = 0;
  virtual std::string finish() = 0;
};

// Text pieces → OutputEvents (content, reasoning, tool calls, stop). After a kStop event the
// parser emits nothing more.
class OutputEventParser {
 public:
  virtual ~OutputEventParser() = default;
  virtual void push(std::string_view text, std::vector<codec::OutputEvent>& events) = 0;
  virtual void finish(std::vector<codec::OutputEvent>& events) = 0;
  // Whether some of the text pushed so far is held back undecided (the start of a possible
  // delimiter or stop string); text that is neither held nor in an event was markup.
  virtual bool holds_text() const = 0;
};

struct ParserOptions {
  std::vector<std::string> stop_strings;
  bool parse_tool_calls = true;   // false: tool-call syntax is plain content (tool_choice none)
  bool parse_reasoning = true;    // false: raw completions, everything is content
  bool starts_in_reasoning = false;  // the prompt ended inside <think>
};

struct EncodedPrompt {
  std::vector<TokenId> ids;
  bool starts_in_reasoning = false;  // the prompt ends inside the reasoning section (<think>)
};

// The start of an assistant turn that the server writes for the model (prefill): the model
// continues from it, and the output parser reads it as if the model had produced it.
struct ForcedPrefix {
  std::string text;
  std::vector<TokenId> ids;
};

class ModelCodec {
 public:
  virtual ~ModelCodec() = default;
  // The generation prompt for a conversation, as token ids (BOS included when the family has one).
  virtual Result<EncodedPrompt> encode_conversation(const codec::Conversation& conversation,
                                                    const codec::RenderOptions& options) const = 0;
  // Plain text without template or BOS (for /v1/completions).
  virtual Result<std::vector<TokenId>> encode_text(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<TokenId>& ids) const = 0;
  // The raw bytes of one token, as logprobs report it (a byte-level token may hold part of a
  // character); empty for an id without text.
  virtual std::string token_bytes(TokenId id) const = 0;
  virtual int vocab_size() const = 0;  // ids at or past this are rejected in prompts
  // Whether the family has a thinking switch, and its default when the request says nothing.
  virtual bool has_thinking_switch() const = 0;
  virtual bool thinking_by_default() const = 0;
  virtual std::unique_ptr<TokenTextStream> make_text_stream() const = 0;
  virtual std::unique_ptr<OutputEventParser> make_parser(const ParserOptions& options) const = 0;
  // How to make the model call a tool (tool_choice required, or the named tool): the opening of
  // the family's tool-call syntax, up to where the model must choose the tool (name empty) or
  // write the arguments. Nothing when the codec has no tool-call syntax.
  virtual std::optional<ForcedPrefix> forced_tool_call(const std::string& tool_name, bool in_reasoning) const {
    return std::nullopt;
  }
};

}  // namespace dsinfer::server
