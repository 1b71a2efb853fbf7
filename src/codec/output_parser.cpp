#include "codec/output_parser.h"

namespace dsinfer::codec {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kOpenFence = "```json\n";
constexpr std::string_view kCloseFence = "\n```";

}  // namespace

void OutputParser::add_delimiter(std::vector<std::string>& list, std::vector<Action>& actions, std::string d, Action a) {
  list.push_back(std::move(d));
  actions.push_back(a);
}

OutputParser::OutputParser(OutputParserOptions options) : options_(std::move(options)) {
  const bool fenced = options_.family != TemplateFamily::kV31;
  auto build = [&](State s, const std::vector<std::pair<std::string, Action>>& delims, bool with_stops) {
    std::vector<std::string> list;
    std::vector<Action> actions;
    for (const auto& [d, a] : delims) add_delimiter(list, actions, d, a);
    if (with_stops)
      for (const auto& stop : options_.stop_strings)
        if (!stop.empty()) add_delimiter(list, actions, stop, Action::kStop);
    Machine& m = machines_[static_cast<int>(s)];
    m.matcher = DelimiterMatcher(list);
    m.actions = std::move(actions);
  };
  std::vector<std::pair<std::string, Action>> content = {{std::string(kThinkOpen), Action::kOpenThink}};
  if (options_.parse_tool_calls) content.push_back({std::string(kCallsBegin), Action::kCallsBegin});
  build(State::kContent, content, true);
  build(State::kReasoning, {{std::string(kThinkClose), Action::kCloseThink}}, true);
  build(State::kToolCalls, {{std::string(kCallBegin), Action::kCallBegin}, {std::string(kCallsEnd), Action::kCallsEnd}}, false);
  build(State::kToolType, {{std::string(kSep), Action::kSep}}, false);
  build(State::kToolName, {{fenced ? std::string("\n") : std::string(kSep), Action::kNameEnd}}, false);
  std::vector<std::pair<std::string, Action>> args = {{std::string(kCallEnd), Action::kCallEnd}};
  // The closing fence belongs to the call's syntax, not to the arguments.
  if (fenced) args.insert(args.begin(), {std::string(kCloseFence) + std::string(kCallEnd), Action::kCallEnd});
  build(State::kToolArgs, args, false);
  state_ = options_.starts_in_reasoning ? State::kReasoning : State::kContent;
}

void OutputParser::emit_text(OutputEventKind kind, std::string_view text) {
  if (text.empty()) return;
  if (!events_.empty() && events_.back().kind == kind && events_.back().tool_index == tool_index_ &&
      (kind == OutputEventKind::kContent || kind == OutputEventKind::kReasoning || kind == OutputEventKind::kToolCallArgs)) {
    events_.back().text.append(text);
    return;
  }
  OutputEvent e;
  e.kind = kind;
  e.text = std::string(text);
  e.tool_index = (kind == OutputEventKind::kToolCallArgs) ? tool_index_ : 0;
  events_.push_back(std::move(e));
}

void OutputParser::release(std::string_view text) {
  if (text.empty()) return;
  switch (state_) {
    case State::kContent:
      seen_content_ = true;
      emit_text(OutputEventKind::kContent, text);
      break;
    case State::kReasoning:
      emit_text(OutputEventKind::kReasoning, text);
      break;
    case State::kToolName:
      name_.append(text);
      break;
    case State::kToolArgs:
      emit_text(OutputEventKind::kToolCallArgs, text);
      break;
    case State::kToolCalls:  // whitespace between calls
    case State::kToolType:   // the call's type, always "function"
    case State::kToolArgsFence:
    case State::kStopped:
      break;
  }
}

void OutputParser::enter(State s) {
  state_ = s;
  held_.clear();
  if (s != State::kStopped && s != State::kToolArgsFence) machines_[static_cast<int>(s)].matcher.reset();
}

void OutputParser::on_delimiter(Action a, const std::string& delimiter) {
  switch (a) {
    case Action::kOpenThink:
      // Reasoning opens only at the very start of the output; later it is plain text.
      if (seen_content_) {
        release(delimiter);
        machines_[static_cast<int>(State::kContent)].matcher.reset();
        return;
      }
      enter(State::kReasoning);
      return;
    case Action::kCloseThink:
      enter(State::kContent);
      seen_content_ = true;  // a second <think> after the reasoning is text
      return;
    case Action::kCallsBegin:
      enter(State::kToolCalls);
      return;
    case Action::kCallBegin:
      name_.clear();
      enter(options_.family == TemplateFamily::kV31 ? State::kToolName : State::kToolType);
      return;
    case Action::kSep:
      enter(State::kToolName);
      return;
    case Action::kNameEnd: {
      OutputEvent e;
      e.kind = OutputEventKind::kToolCallBegin;
      e.text = name_;
      e.tool_index = tool_index_;
      events_.push_back(std::move(e));
      name_.clear();
      if (options_.family == TemplateFamily::kV31) {
        enter(State::kToolArgs);
      } else {
        enter(State::kToolArgsFence);
        fence_.clear();
      }
      return;
    }
    case Action::kCallEnd: {
      OutputEvent e;
      e.kind = OutputEventKind::kToolCallEnd;
      e.tool_index = tool_index_;
      events_.push_back(std::move(e));
      ++tool_index_;
      enter(State::kToolCalls);
      return;
    }
    case Action::kCallsEnd:
      enter(State::kContent);
      seen_content_ = true;
      return;
    case Action::kStop: {
      OutputEvent e;
      e.kind = OutputEventKind::kStop;
      e.text = delimiter;
      events_.push_back(std::move(e));
      enter(State::kStopped);
      return;
    }
  }
}

void OutputParser::flush_fence() {
  // The bytes read while checking for "```json\n" turned out to be arguments.
  const std::string bytes = std::move(fence_);
  fence_.clear();
  enter(State::kToolArgs);
  process(bytes);  // they may contain the end of the call
}

std::vector<OutputEvent> OutputParser::feed(std::string_view text) {
  process(text);
  std::vector<OutputEvent> out = std::move(events_);
  events_.clear();
  return out;
}

void OutputParser::process(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (state_ == State::kStopped) break;
    const auto b = static_cast<uint8_t>(text[i]);
    if (state_ == State::kToolArgsFence) {
      fence_.push_back(static_cast<char>(b));
      if (fence_.size() <= kOpenFence.size() && kOpenFence.substr(0, fence_.size()) == fence_) {
        if (fence_.size() == kOpenFence.size()) {
          fence_.clear();
          enter(State::kToolArgs);
        }
        continue;
      }
      flush_fence();
      continue;
    }
    Machine& m = machines_[static_cast<int>(state_)];
    held_.push_back(static_cast<char>(b));
    const DelimiterMatcher::Step step = m.matcher.push(b);
    if (step.matched >= 0) {
      const std::string& d = m.matcher.delimiter(step.matched);
      release(std::string_view(held_).substr(0, held_.size() - d.size()));
      held_.clear();
      on_delimiter(m.actions[step.matched], d);
      continue;
    }
    if (held_.size() > step.num_held_bytes) {
      release(std::string_view(held_).substr(0, held_.size() - step.num_held_bytes));
      held_.erase(0, held_.size() - step.num_held_bytes);
    }
  }
}

std::vector<OutputEvent> OutputParser::finish() {
  if (state_ == State::kToolArgsFence && !fence_.empty()) {
    const std::string bytes = std::move(fence_);
    fence_.clear();
    state_ = State::kToolArgs;
    held_.clear();
    release(bytes);
  }
  if (!held_.empty()) {
    release(held_);
    held_.clear();
  }
  switch (state_) {
    case State::kToolName: {
      // The output ended inside a call: report what there is.
      OutputEvent b;
      b.kind = OutputEventKind::kToolCallBegin;
      b.text = name_;
      b.tool_index = tool_index_;
      events_.push_back(std::move(b));
      [[fallthrough]];
    }
    case State::kToolArgsFence:
    case State::kToolArgs: {
      OutputEvent e;
      e.kind = OutputEventKind::kToolCallEnd;
      e.tool_index = tool_index_;
      events_.push_back(std::move(e));
      ++tool_index_;
      break;
    }
    default:
      break;
  }
  state_ = State::kStopped;
  std::vector<OutputEvent> out = std::move(events_);
  events_.clear();
  return out;
}

}  // namespace dsinfer::codec
