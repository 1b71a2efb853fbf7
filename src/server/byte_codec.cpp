// ByteCodec: bytes as tokens, a line-per-message rendering, and a small markup parser.
#include "server/byte_codec.h"

#include <algorithm>

namespace dsinfer::server {

using codec::OutputEvent;
using codec::OutputEventKind;

namespace {

const char* role_name(codec::Role role) {
  switch (role) {
    case codec::Role::kSystem: return "system";
    case codec::Role::kUser: return "user";
    case codec::Role::kAssistant: return "assistant";
    case codec::Role::kTool: return "tool";
  }
  return "user";
}

void append_bytes(const std::string& text, std::vector<TokenId>& ids) {
  for (unsigned char c : text) ids.push_back(static_cast<TokenId>(c));
}

// Length of the longest suffix of `text` that is a proper prefix of `pattern`.
size_t partial_suffix(std::string_view text, std::string_view pattern) {
  size_t max_len = std::min(text.size(), pattern.size() - 1);
  for (size_t len = max_len; len > 0; --len) {
    if (text.substr(text.size() - len) == pattern.substr(0, len)) return len;
  }
  return 0;
}

// Holds back an incomplete UTF-8 sequence at the end of the bytes seen so far.
class Utf8ByteStream : public TokenTextStream {
 public:
  std::string push(TokenId id) override {
    if (id < 0 || id > 255) return "";
    pending_ += static_cast<char>(id);
    size_t complete = complete_prefix(pending_);
    std::string out = pending_.substr(0, complete);
    pending_.erase(0, complete);
    return out;
  }
  std::string finish() override { return std::exchange(pending_, std::string()); }

 private:
  static size_t complete_prefix(const std::string& s) {
    // Look back at most 3 bytes for a lead byte whose sequence is not yet complete.
    size_t n = s.size();
    for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
      unsigned char c = static_cast<unsigned char>(s[n - back]);
      if ((c & 0xC0) == 0x80) continue;  // continuation byte
      size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      return need > back ? n - back : n;
    }
    return n;
  }
  std::string pending_;
};

class MarkupParser : public OutputEventParser {
 public:
  explicit MarkupParser(ParserOptions options) : options_(std::move(options)) {
    if (options_.starts_in_reasoning && options_.parse_reasoning) state_ = State::kReasoning;
  }

  void push(std::string_view text, std::vector<OutputEvent>& events) override {
    if (stopped_) return;
    pending_ += text;
    drain(events, /*final=*/false);
  }

  void finish(std::vector<OutputEvent>& events) override {
    if (stopped_) return;
    drain(events, /*final=*/true);
    if (state_ == State::kToolName && !pending_.empty()) {
      events.push_back({OutputEventKind::kToolCallBegin, pending_, tool_index_});
      pending_.clear();
      state_ = State::kToolArgs;
    }
    if (state_ == State::kToolArgs) events.push_back({OutputEventKind::kToolCallEnd, "", tool_index_++});
  }

  bool holds_text() const override { return !pending_.empty(); }

 private:
  enum class State { kContent, kReasoning, kToolName, kToolArgs };

  // The strings that change state from `state_`; stop strings apply to the answer text.
  std::vector<std::string> patterns() const {
    std::vector<std::string> p;
    switch (state_) {
      case State::kContent:
        if (options_.parse_reasoning) p.push_back("<think>");
        if (options_.parse_tool_calls) p.push_back("<tool_call>");
        for (const auto& s : options_.stop_strings) p.push_back(s);
        break;
      case State::kReasoning: p.push_back("</think>"); break;
      case State::kToolName: p.push_back("\n"); break;
      case State::kToolArgs: p.push_back("</tool_call>"); break;
    }
    return p;
  }

  void emit_text(std::string text, std::vector<OutputEvent>& events) {
    if (text.empty()) return;
    switch (state_) {
      case State::kContent: events.push_back({OutputEventKind::kContent, std::move(text), 0}); break;
      case State::kReasoning: events.push_back({OutputEventKind::kReasoning, std::move(text), 0}); break;
      case State::kToolArgs: events.push_back({OutputEventKind::kToolCallArgs, std::move(text), tool_index_}); break;
      case State::kToolName: break;  // the name is emitted whole
    }
  }

  void drain(std::vector<OutputEvent>& events, bool final) {
    while (!pending_.empty()) {
      auto pats = patterns();
      size_t best = std::string::npos;
      std::string matched;
      for (const auto& p : pats) {
        size_t at = pending_.find(p);
        if (at < best || (at == best && p.size() > matched.size())) {
          best = at;
          matched = p;
        }
      }
      if (best == std::string::npos) {
        if (state_ == State::kToolName) {
          if (final) return;  // finish() emits what is left as the name
          return;
        }
        size_t hold = 0;
        if (!final) {
          for (const auto& p : pats) hold = std::max(hold, partial_suffix(pending_, p));
        }
        emit_text(pending_.substr(0, pending_.size() - hold), events);
        pending_.erase(0, pending_.size() - hold);
        return;
      }
      std::string before = pending_.substr(0, best);
      pending_.erase(0, best + matched.size());
      if (state_ == State::kToolName) {
        events.push_back({OutputEventKind::kToolCallBegin, before, tool_index_});
        state_ = State::kToolArgs;
        continue;
      }
      emit_text(std::move(before), events);
      if (state_ == State::kContent && matched == "<think>") {
        state_ = State::kReasoning;
      } else if (state_ == State::kContent && matched == "<tool_call>" && options_.parse_tool_calls) {
        state_ = State::kToolName;
      } else if (state_ == State::kContent) {
        events.push_back({OutputEventKind::kStop, matched, 0});
        stopped_ = true;
        pending_.clear();
        return;
      } else if (state_ == State::kReasoning) {
        state_ = State::kContent;
      } else if (state_ == State::kToolArgs) {
        events.push_back({OutputEventKind::kToolCallEnd, "", tool_index_++});
        state_ = State::kContent;
      }
    }
  }

  ParserOptions options_;
  State state_ = State::kContent;
  std::string pending_;
  int tool_index_ = 0;
  bool stopped_ = false;
};

}  // namespace

Result<EncodedPrompt> ByteCodec::encode_conversation(const codec::Conversation& conversation,
                                                     const codec::RenderOptions& options) const {
  if (conversation.messages.empty()) return Status(StatusCode::kInvalidArgument, "the conversation is empty");
  std::vector<TokenId> ids;
  for (const auto& tool : conversation.tools) append_bytes("tool " + tool.name + ": " + tool.parameters_json + "\n", ids);
  for (const auto& m : conversation.messages) {
    append_bytes(std::string(role_name(m.role)) + ": " + m.content + "\n", ids);
    for (const auto& call : m.tool_calls) append_bytes("call " + call.name + " " + call.arguments_json + "\n", ids);
  }
  if (options.add_generation_prompt) {
    ids.push_back(kReplyBegin);
    append_bytes(conversation.messages.back().content, ids);
    ids.push_back(kReplyEnd);
  }
  return EncodedPrompt{std::move(ids), false};
}

Result<std::vector<TokenId>> ByteCodec::encode_text(const std::string& text) const {
  std::vector<TokenId> ids;
  append_bytes(text, ids);
  return ids;
}

std::string ByteCodec::decode(const std::vector<TokenId>& ids) const {
  std::string text;
  for (TokenId id : ids) {
    if (id >= 0 && id < 256) text += static_cast<char>(id);
  }
  return text;
}

std::string ByteCodec::token_bytes(TokenId id) const {
  return id >= 0 && id < 256 ? std::string(1, static_cast<char>(id)) : std::string();
}

std::unique_ptr<TokenTextStream> ByteCodec::make_text_stream() const { return std::make_unique<Utf8ByteStream>(); }

std::unique_ptr<OutputEventParser> ByteCodec::make_parser(const ParserOptions& options) const {
  return make_markup_parser(options);
}

std::unique_ptr<OutputEventParser> make_markup_parser(const ParserOptions& options) {
  return std::make_unique<MarkupParser>(options);
}

}  // namespace dsinfer::server
