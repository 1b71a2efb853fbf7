// libFuzzer target: JSON request parsing of every protocol, then the protocol's encoder over
// the parsed conversation. The first byte picks the protocol (Chat Completions, Completions,
// Responses, Messages); the rest is the body.
//
// Any input must end in an ApiRequest that satisfies the invariants below or in an
// InvalidArgument error with a message; a crash, an escaping exception or a failed check is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "codec/anthropic_messages_protocol.h"
#include "codec/openai_chat_protocol.h"
#include "codec/openai_responses_protocol.h"
#include "core/check.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) { return 0; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsinfer::codec;
  if (size == 0) return 0;
  const ApiProtocol protocol = static_cast<ApiProtocol>(data[0] % 4);
  std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string param;
  dsinfer::Result<ApiRequest> parsed = dsinfer::Status(dsinfer::StatusCode::kInternal, "");
  switch (protocol) {
    case ApiProtocol::kChatCompletions: parsed = parse_chat_completions_request(body, &param); break;
    case ApiProtocol::kCompletions: parsed = parse_completions_request(body, &param); break;
    case ApiProtocol::kResponses: parsed = parse_responses_request(body, &param); break;
    case ApiProtocol::kMessages: parsed = parse_messages_request(body, &param); break;
  }
  if (!parsed.ok()) {
    DS_CHECK(parsed.status().code() == dsinfer::StatusCode::kInvalidArgument);
    DS_CHECK(!parsed.status().message().empty());
    (void)error_body(protocol, ApiError{400, "", param, parsed.status().message()});
    return 0;
  }
  const ApiRequest& request = parsed.value();
  DS_CHECK(request.n >= 1 && request.n <= 16);
  DS_CHECK(request.sampling.max_tokens >= 1);
  DS_CHECK(request.sampling.top_p > 0.0f && request.sampling.top_p <= 1.0f);
  DS_CHECK(request.sampling.temperature >= 0.0f);
  DS_CHECK(request.raw_prompt || !request.conversation.messages.empty());

  // Feed the conversation's own text back through both encoder modes as model output.
  for (bool stream : {false, true}) {
    EncoderOptions options;
    options.response_id = "id-fuzz";
    options.model = request.model;
    options.stream = stream;
    options.include_usage = true;
    options.num_choices = request.n;
    auto encoder = make_protocol_encoder(request.protocol, options);
    std::string out;
    encoder->begin(out);
    for (int choice = 0; choice < request.n; ++choice) {
      int tool_index = 0;
      for (const auto& m : request.conversation.messages) {
        if (m.reasoning_content) encoder->on_event(choice, {OutputEventKind::kReasoning, *m.reasoning_content, 0}, out);
        encoder->on_event(choice, {OutputEventKind::kContent, m.content, 0}, out);
        for (const auto& call : m.tool_calls) {
          encoder->on_event(choice, {OutputEventKind::kToolCallBegin, call.name, tool_index}, out);
          encoder->on_event(choice, {OutputEventKind::kToolCallArgs, call.arguments_json, tool_index}, out);
          encoder->on_event(choice, {OutputEventKind::kToolCallEnd, "", tool_index++}, out);
        }
      }
      encoder->end_choice(choice, ChoiceEnd::kStopString, request.stop.empty() ? "" : request.stop[0], out);
    }
    encoder->end(UsageCounts{}, out);
    DS_CHECK(!out.empty());
  }
  return 0;
}
