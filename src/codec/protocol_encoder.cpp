// The one place that maps a protocol to its encoder.
#include "codec/protocol_encoder.h"

#include "codec/anthropic_messages_protocol.h"
#include "codec/openai_chat_protocol.h"
#include "codec/openai_responses_protocol.h"

namespace dsinfer::codec {

std::unique_ptr<ProtocolEncoder> make_protocol_encoder(ApiProtocol protocol, EncoderOptions options) {
  switch (protocol) {
    case ApiProtocol::kChatCompletions: return make_chat_completions_encoder(std::move(options));
    case ApiProtocol::kCompletions: return make_completions_encoder(std::move(options));
    case ApiProtocol::kResponses: return make_responses_encoder(std::move(options));
    case ApiProtocol::kMessages: return make_messages_encoder(std::move(options));
  }
  return nullptr;
}

}  // namespace dsinfer::codec
