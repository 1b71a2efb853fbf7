// Events of the streaming output parser: what the model's text means, piece by piece.
#pragma once

#include <string>

namespace dsinfer::codec {

enum class OutputEventKind {
  kContent,        // text: visible answer text
  kReasoning,      // text: reasoning text (inside <think>…</think>)
  kToolCallBegin,  // tool_index, text = the tool's name (emitted once per call)
  kToolCallArgs,   // tool_index, text = a fragment of the arguments' JSON
  kToolCallEnd,    // tool_index
  kStop,           // text = the stop string that matched; nothing follows
};

struct OutputEvent {
  OutputEventKind kind = OutputEventKind::kContent;
  std::string text;
  int tool_index = 0;
  bool operator==(const OutputEvent&) const = default;
};

}  // namespace dsinfer::codec
