// The ModelCodec of DeepSeek checkpoints: the model directory's tokenizer (tokenizer.json,
// tokenizer_config.json), its chat-template family (V3, V3.1, R1) and the codec's streaming
// output parser. Thinking is switchable on V3.1 (off unless asked, as DeepSeek's API does);
// R1 prompts open the reasoning section themselves.
//
// Limits: rendered prompts are encoded with special tokens allowed, so a message that spells
// a special token gets that token; raw completions go through the same parser with tool calls
// off, so their <think>…</think> text is reported as reasoning and returned as text.
#pragma once

#include <memory>
#include <string>

#include "codec/chat_template.h"
#include "server/model_codec.h"

namespace dsinfer {
class Tokenizer;
}

namespace dsinfer::server {

class DeepseekCodec : public ModelCodec {
 public:
  // Throws dsinfer::Error when the tokenizer or template cannot be read. `model_vocab_size`
  // (config.json) bounds the ids a prompt may hold, as the tokenizer may know more ids.
  static std::unique_ptr<DeepseekCodec> load(const std::string& model_dir, int model_vocab_size);
  ~DeepseekCodec() override;

  Result<EncodedPrompt> encode_conversation(const codec::Conversation& conversation,
                                            const codec::RenderOptions& options) const override;
  Result<std::vector<TokenId>> encode_text(const std::string& text) const override;
  std::string decode(const std::vector<TokenId>& ids) const override;
  std::string token_bytes(TokenId id) const override;
  int vocab_size() const override { return vocab_size_; }
  bool has_thinking_switch() const override { return family_ == codec::TemplateFamily::kV31; }
  bool thinking_by_default() const override { return false; }
  std::unique_ptr<TokenTextStream> make_text_stream() const override;
  std::unique_ptr<OutputEventParser> make_parser(const ParserOptions& options) const override;
  std::optional<ForcedPrefix> forced_tool_call(const std::string& tool_name, bool in_reasoning) const override;

  codec::TemplateFamily family() const { return family_; }

 private:
  DeepseekCodec() = default;
  std::unique_ptr<Tokenizer> tokenizer_;
  codec::TemplateFamily family_ = codec::TemplateFamily::kV3;
  int vocab_size_ = 0;
};

}  // namespace dsinfer::server
