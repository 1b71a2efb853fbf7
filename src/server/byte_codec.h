// A self-contained ModelCodec over bytes, paired with EchoEngine for serving without a model
// (`dsinfer serve --engine echo`): end-to-end tests of the HTTP layer with the real clients,
// and load tests of the server alone.
//
// Ids 0..255 are bytes; kEosId ends a turn. A conversation renders as "role: text\n" lines,
// then kReplyBegin, the last message's text, kReplyEnd: EchoEngine answers with the bytes
// between those markers, so a test scripts the "model's" answer through its last message.
// Output markup: <think>…</think> is reasoning, <tool_call>NAME\nARGS</tool_call> a tool call.
#pragma once

#include "server/model_codec.h"

namespace dsinfer::server {

class ByteCodec : public ModelCodec {
 public:
  static constexpr TokenId kEosId = 256;
  static constexpr TokenId kReplyBegin = 257;
  static constexpr TokenId kReplyEnd = 258;
  static constexpr int kVocabSize = 259;

  Result<EncodedPrompt> encode_conversation(const codec::Conversation& conversation,
                                            const codec::RenderOptions& options) const override;
  Result<std::vector<TokenId>> encode_text(const std::string& text) const override;
  std::string decode(const std::vector<TokenId>& ids) const override;
  std::string token_bytes(TokenId id) const override;
  int vocab_size() const override { return kVocabSize; }
  bool has_thinking_switch() const override { return true; }
  bool thinking_by_default() const override { return false; }
  std::unique_ptr<TokenTextStream> make_text_stream() const override;
  std::unique_ptr<OutputEventParser> make_parser(const ParserOptions& options) const override;
};

// The markup parser ByteCodec uses, exposed for tests: tags and stop strings split across
// pieces are held back until they can be decided.
std::unique_ptr<OutputEventParser> make_markup_parser(const ParserOptions& options);

}  // namespace dsinfer::server
