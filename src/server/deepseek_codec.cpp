// DeepseekCodec: thin adapters from the tokenizer and codec modules to ModelCodec.
#include "server/deepseek_codec.h"

#include <algorithm>

#include "codec/output_parser.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::server {

namespace {

class DecoderStream : public TokenTextStream {
 public:
  explicit DecoderStream(const Tokenizer& tokenizer) : decoder_(tokenizer, /*skip_special=*/true) {}
  std::string push(TokenId id) override { return decoder_.push(id); }
  std::string finish() override { return decoder_.finish(); }

 private:
  StreamDecoder decoder_;
};

class ParserAdapter : public OutputEventParser {
 public:
  explicit ParserAdapter(codec::OutputParserOptions options) : parser_(std::move(options)) {}
  void push(std::string_view text, std::vector<codec::OutputEvent>& events) override {
    auto out = parser_.feed(text);
    events.insert(events.end(), out.begin(), out.end());
  }
  void finish(std::vector<codec::OutputEvent>& events) override {
    auto out = parser_.finish();
    events.insert(events.end(), out.begin(), out.end());
  }
  bool holds_text() const override { return parser_.holds_text(); }

 private:
  codec::OutputParser parser_;
};

}  // namespace

DeepseekCodec::~DeepseekCodec() = default;

std::unique_ptr<DeepseekCodec> DeepseekCodec::load(const std::string& model_dir, int model_vocab_size) {
  std::unique_ptr<DeepseekCodec> c(new DeepseekCodec());
  c->tokenizer_ = Tokenizer::load(model_dir);
  c->family_ = codec::detect_template_family(model_dir);
  c->vocab_size_ = model_vocab_size > 0 ? std::min(model_vocab_size, c->tokenizer_->vocab_size()) : c->tokenizer_->vocab_size();
  return c;
}

Result<EncodedPrompt> DeepseekCodec::encode_conversation(const codec::Conversation& conversation,
                                                         const codec::RenderOptions& options) const {
  std::string prompt = codec::render_prompt(family_, conversation, options, tokenizer_->bos_token());
  EncodedPrompt encoded;
  encoded.ids = tokenizer_->encode(prompt, /*allow_special=*/true);
  encoded.starts_in_reasoning = codec::prompt_starts_in_reasoning(family_, options, prompt);
  for (TokenId id : encoded.ids) {
    if (id >= vocab_size_) {
      return Status(StatusCode::kInvalidArgument, "the prompt encodes to token id " + std::to_string(id) +
                                                      ", outside the model's vocabulary of " + std::to_string(vocab_size_));
    }
  }
  return encoded;
}

std::optional<ForcedPrefix> DeepseekCodec::forced_tool_call(const std::string& tool_name, bool in_reasoning) const {
  ForcedPrefix p;
  // A prompt that ends inside <think> (R1, V3.1 thinking) first closes the reasoning.
  if (in_reasoning) p.text = "\n</think>\n\n";
  p.text += "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>";
  if (family_ == codec::TemplateFamily::kV31) {
    // V3.1: <｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{raw json}<｜tool▁call▁end｜>
    if (!tool_name.empty()) p.text += tool_name + "<｜tool▁sep｜>";
  } else {
    // V3 and R1: <｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>
    p.text += "function<｜tool▁sep｜>";
    if (!tool_name.empty()) p.text += tool_name + "\n```json\n";
  }
  p.ids = tokenizer_->encode(p.text, /*allow_special=*/true);
  for (TokenId id : p.ids)
    if (id >= vocab_size_) return std::nullopt;  // the model lacks the tool tokens
  return p;
}

Result<std::vector<TokenId>> DeepseekCodec::encode_text(const std::string& text) const {
  std::vector<TokenId> ids = tokenizer_->encode_prompt(text);
  for (TokenId id : ids) {
    if (id >= vocab_size_) {
      return Status(StatusCode::kInvalidArgument, "the prompt encodes to token id " + std::to_string(id) +
                                                      ", outside the model's vocabulary of " + std::to_string(vocab_size_));
    }
  }
  return ids;
}

std::string DeepseekCodec::decode(const std::vector<TokenId>& ids) const { return tokenizer_->decode(ids, /*skip_special=*/false); }

std::string DeepseekCodec::token_bytes(TokenId id) const { return std::string(tokenizer_->token_bytes(id)); }

std::unique_ptr<TokenTextStream> DeepseekCodec::make_text_stream() const { return std::make_unique<DecoderStream>(*tokenizer_); }

std::unique_ptr<OutputEventParser> DeepseekCodec::make_parser(const ParserOptions& options) const {
  codec::OutputParserOptions o;
  o.family = family_;
  o.starts_in_reasoning = options.starts_in_reasoning;
  o.parse_tool_calls = options.parse_tool_calls;
  o.stop_strings = options.stop_strings;
  return std::make_unique<ParserAdapter>(std::move(o));
}

}  // namespace dsinfer::server
