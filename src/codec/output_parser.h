// The streaming output parser: model text in (pieces of any size), events out — content,
// reasoning (<think>…</think>, or from the first byte when the prompt opened <think>), tool
// calls in the V3/R1 form (type, name, fenced json) and the V3.1 form (name, raw json), and
// stop strings.
//
// Delimiters are matched incrementally (Aho-Corasick, each byte looked at once); only a
// trailing partial delimiter is held back between feeds. The tool name is emitted once, when
// complete; argument fragments are emitted as they arrive and concatenate to the arguments'
// JSON text. Fragmentation of text events depends on how the input was cut; the merged
// stream (adjacent text events of one kind joined) does not.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "codec/chat_template.h"
#include "codec/delimiter_matcher.h"
#include "codec/output_event.h"

namespace dsinfer::codec {

struct OutputParserOptions {
  TemplateFamily family = TemplateFamily::kV3;
  bool starts_in_reasoning = false;
  bool parse_tool_calls = true;
  std::vector<std::string> stop_strings;  // matched in content and reasoning, not in tool calls
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);

  std::vector<OutputEvent> feed(std::string_view text);
  // Flushes held-back text; closes a tool call left open by the end of the output.
  std::vector<OutputEvent> finish();

  bool stopped() const { return state_ == State::kStopped; }
  // Whether bytes fed so far wait for more to decide whether they begin a delimiter.
  bool holds_text() const { return !held_.empty(); }

 private:
  enum class State {
    kContent,
    kReasoning,
    kToolCalls,     // between calls: waiting for a call to begin or the block to end
    kToolType,      // V3/R1: the call's type ("function"), up to the separator
    kToolName,      // up to "\n" (V3/R1) or the separator (V3.1)
    kToolArgsFence, // V3/R1: the "```json\n" that opens the arguments
    kToolArgs,
    kStopped,
  };
  // What a completed delimiter means.
  enum class Action { kOpenThink, kCloseThink, kCallsBegin, kCallBegin, kCallsEnd, kSep, kNameEnd, kCallEnd, kStop };

  struct Machine {
    DelimiterMatcher matcher;
    std::vector<Action> actions;
  };
  void add_delimiter(std::vector<std::string>& list, std::vector<Action>& actions, std::string d, Action a);
  void enter(State s);
  void release(std::string_view text);  // text that is final for the current state
  void on_delimiter(Action a, const std::string& delimiter);
  void emit_text(OutputEventKind kind, std::string_view text);
  void flush_fence();
  void process(std::string_view text);

  OutputParserOptions options_;
  Machine machines_[8];
  State state_ = State::kContent;
  std::string held_;  // bytes that may be the start of a delimiter
  std::string name_;  // the tool name being read
  std::string fence_; // the bytes read while checking for the opening fence
  bool seen_content_ = false;
  int tool_index_ = 0;
  std::vector<OutputEvent> events_;
};

}  // namespace dsinfer::codec
