// Replays mutations of valid requests of every protocol through fuzz/fuzz_requests.cpp, so the
// normal build exercises the fuzz target without clang/libFuzzer.
#include <gtest/gtest.h>

#include <random>
#include <string>

#define LLVMFuzzerTestOneInput fuzz_requests_one_input
#include "../../../fuzz/fuzz_requests.cpp"
#undef LLVMFuzzerTestOneInput

namespace dsinfer::codec {
namespace {

const char* const kSeeds[4] = {
    R"({"model":"m","n":2,"stop":["x"],"stream":true,"stream_options":{"include_usage":true},"max_tokens":9,
        "messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"q"}]},
        {"role":"assistant","content":null,"reasoning_content":"r","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"c","content":"o"}],
        "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"auto",
        "response_format":{"type":"json_object"},"thinking":{"type":"enabled"},"temperature":0.5,"top_p":0.9,"seed":3})",
    R"({"model":"m","prompt":[1,2,3],"max_tokens":4,"echo":true,"stop":"s","temperature":0})",
    R"({"model":"m","instructions":"i","input":[{"role":"user","content":[{"type":"input_text","text":"q"}]},
        {"type":"reasoning","summary":[{"type":"summary_text","text":"t"}]},
        {"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}],
        "tools":[{"type":"function","name":"f","parameters":{}}],"tool_choice":{"type":"function","name":"f"},
        "max_output_tokens":5,"text":{"format":{"type":"text"}},"reasoning":{"effort":"low"}})",
    R"({"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],"stop_sequences":["E"],
        "messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":""},
        {"type":"tool_use","id":"t","name":"f","input":{"a":[1,{"b":null}]}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r"}],"is_error":true}]}],
        "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"},
        "thinking":{"type":"disabled"},"top_k":5})",
};

std::string mutate(std::string s, std::mt19937& rng) {
  static const char* const kTokens[] = {"null", "[]", "{}", "\"\"", "-1", "1e309", "0", "true", "\"\\ud800\"", "\xff",
                                        "[[[[", "\"x\"", ",", ":", "}", "]", "999999999999999999999"};
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  const int num_edits = 1 + static_cast<int>(rng() % 3);
  for (int e = 0; e < num_edits && !s.empty(); ++e) {
    switch (rng() % 5) {
      case 0: s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8)); break;
      case 1: s.resize(pick(s.size())); break;
      case 2: {  // replace a JSON value-ish span with an interesting token
        size_t at = pick(s.size());
        size_t len = pick(std::min<size_t>(12, s.size() - at));
        s.replace(at, len, kTokens[pick(std::size(kTokens))]);
        break;
      }
      case 3: {
        size_t at = pick(s.size()), len = pick(std::min<size_t>(40, s.size() - at));
        s.insert(pick(s.size()), s.substr(at, len));
        break;
      }
      default: s.erase(pick(s.size()), pick(8)); break;
    }
  }
  return s;
}

TEST(FuzzRequests, SeedsParse) {
  for (int p = 0; p < 4; ++p) {
    std::string input(1, static_cast<char>(p));
    input += kSeeds[p];
    EXPECT_EQ(fuzz_requests_one_input(reinterpret_cast<const uint8_t*>(input.data()), input.size()), 0);
    std::string param;
    ApiProtocol protocol = static_cast<ApiProtocol>(p);
    bool ok = protocol == ApiProtocol::kChatCompletions ? parse_chat_completions_request(kSeeds[p], &param).ok()
              : protocol == ApiProtocol::kCompletions   ? parse_completions_request(kSeeds[p], &param).ok()
              : protocol == ApiProtocol::kResponses     ? parse_responses_request(kSeeds[p], &param).ok()
                                                        : parse_messages_request(kSeeds[p], &param).ok();
    EXPECT_TRUE(ok) << "seed " << p << " param " << param;
  }
}

TEST(FuzzRequests, MutationsNeverCrash) {
  std::mt19937 rng(12345);
  for (int i = 0; i < 20000; ++i) {
    int p = i % 4;
    std::string input(1, static_cast<char>(p));
    input += mutate(kSeeds[p], rng);
    ASSERT_EQ(fuzz_requests_one_input(reinterpret_cast<const uint8_t*>(input.data()), input.size()), 0);
  }
}

}  // namespace
}  // namespace dsinfer::codec
