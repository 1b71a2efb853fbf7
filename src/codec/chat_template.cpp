#include "codec/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace dsinfer::codec {
namespace {

constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kOutputsBegin = "<｜tool▁outputs▁begin｜>";
constexpr std::string_view kOutputsEnd = "<｜tool▁outputs▁end｜>";
constexpr std::string_view kOutputBegin = "<｜tool▁output▁begin｜>";
constexpr std::string_view kOutputEnd = "<｜tool▁output▁end｜>";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

// The templates test `content is none`: see the header for the mapping.
bool content_is_none(const Message& m) { return m.role == Role::kAssistant && !m.tool_calls.empty() && m.content.empty(); }

// All system messages, wherever they are, joined by a blank line after the BOS.
void append_system_prompt(const Conversation& c, std::string& out) {
  bool first = true;
  for (const auto& m : c.messages) {
    if (m.role != Role::kSystem) continue;
    if (!first) out += "\n\n";
    out += m.content;
    first = false;
  }
}

// One tool result: <｜tool▁output▁begin｜>content<｜tool▁output▁end｜>.
void append_tool_output(std::string_view content, std::string& out) {
  out += kOutputBegin;
  out += content;
  out += kOutputEnd;
}

// The V3 / R1 tool call body: type, name and the arguments in a json fence.
void append_fenced_call(const ToolCall& call, std::string& out) {
  out += "function";
  out += kSep;
  out += call.name;
  out += "\n```json\n";
  out += call.arguments_json;
  out += "\n```";
  out += kCallEnd;
}

std::string render_v3(const Conversation& c, const RenderOptions& o, const std::string& bos) {
  std::string out = bos;
  append_system_prompt(c, out);
  bool is_first = false, is_tool = false, is_output_first = true;
  for (const auto& m : c.messages) {
    switch (m.role) {
      case Role::kSystem:
        break;
      case Role::kUser:
        is_tool = false;
        out += kUser;
        out += m.content;
        break;
      case Role::kAssistant:
        if (content_is_none(m)) {
          is_tool = false;
          for (const auto& call : m.tool_calls) {
            if (!is_first) {
              // Quirk: is_first is never reset, and a call rendered here is never closed
              // with tool_calls_end unless a second call follows.
              out += kAssistant;
              out += kCallsBegin;
              out += kCallBegin;
              append_fenced_call(call, out);
              is_first = true;
            } else {
              out += "\n";
              out += kCallBegin;
              append_fenced_call(call, out);
              out += kCallsEnd;
              out += kEos;
            }
          }
        } else {
          // Quirk: when content is set, tool calls are not rendered at all.
          if (is_tool) {
            out += kOutputsEnd;
            out += m.content;
            out += kEos;
            is_tool = false;
          } else {
            out += kAssistant;
            out += m.content;
            out += kEos;
          }
        }
        break;
      case Role::kTool:
        is_tool = true;
        out += is_output_first ? kOutputsBegin : std::string_view("\n");
        is_output_first = false;
        append_tool_output(m.content, out);
        break;
    }
  }
  if (is_tool) out += kOutputsEnd;
  if (o.add_generation_prompt && !is_tool) out += kAssistant;
  return out;
}

std::string render_r1(const Conversation& c, const RenderOptions& o, const std::string& bos) {
  std::string out = bos;
  append_system_prompt(c, out);
  bool is_first = false, is_tool = false, is_output_first = true;
  for (const auto& m : c.messages) {
    switch (m.role) {
      case Role::kSystem:
        break;
      case Role::kUser:
        is_tool = false;
        out += kUser;
        out += m.content;
        break;
      case Role::kAssistant:
        if (!m.tool_calls.empty()) {
          is_tool = false;
          for (const auto& call : m.tool_calls) {
            if (!is_first) {
              out += kAssistant;
              if (!content_is_none(m)) out += m.content;
              out += kCallsBegin;
              out += kCallBegin;
              append_fenced_call(call, out);
              is_first = true;  // quirk: never reset for later messages
            } else {
              out += "\n";
              out += kCallBegin;
              append_fenced_call(call, out);
            }
          }
          out += kCallsEnd;
          out += kEos;
        } else if (is_tool) {
          out += kOutputsEnd;
          out += m.content;
          out += kEos;
          is_tool = false;
        } else {
          // Earlier reasoning is dropped: only what follows the last </think> is kept.
          std::string_view content = m.content;
          const size_t close = content.rfind(kThinkClose);
          if (close != std::string_view::npos) content = content.substr(close + kThinkClose.size());
          out += kAssistant;
          out += content;
          out += kEos;
        }
        break;
      case Role::kTool:
        is_tool = true;
        if (is_output_first) {
          out += kOutputsBegin;
          is_output_first = false;
        }
        append_tool_output(m.content, out);
        break;
    }
  }
  if (is_tool) out += kOutputsEnd;
  if (o.add_generation_prompt && !is_tool) {
    out += kAssistant;
    out += kThinkOpen;
    out += "\n";
  }
  return out;
}

std::string render_v31(const Conversation& c, const RenderOptions& o, const std::string& bos) {
  std::string out = bos;
  append_system_prompt(c, out);
  bool is_first = false, is_tool = false, is_last_user = false;
  for (const auto& m : c.messages) {
    switch (m.role) {
      case Role::kSystem:
        break;
      case Role::kUser:
        is_tool = false;
        is_first = false;
        is_last_user = true;
        out += kUser;
        out += m.content;
        break;
      case Role::kAssistant:
        if (!m.tool_calls.empty()) {
          if (is_last_user) {
            out += kAssistant;
            out += kThinkClose;
          }
          is_last_user = false;
          is_first = false;
          is_tool = false;
          for (const auto& call : m.tool_calls) {
            if (!is_first) {
              if (!content_is_none(m)) out += m.content;
              out += kCallsBegin;
              is_first = true;
            }
            out += kCallBegin;
            out += call.name;
            out += kSep;
            out += call.arguments_json;
            out += kCallEnd;
          }
          out += kCallsEnd;
          out += kEos;
        } else {
          if (is_last_user) {
            out += kAssistant;
            out += kThinkClose;  // an earlier turn is always rendered as non-thinking
          }
          is_last_user = false;
          if (is_tool) {
            out += m.content;
            out += kEos;
            is_tool = false;
          } else {
            std::string_view content = m.content;
            const size_t close = content.find(kThinkClose);
            if (close != std::string_view::npos) content = content.substr(close + kThinkClose.size());
            out += content;
            out += kEos;
          }
        }
        break;
      case Role::kTool:
        is_last_user = false;
        is_tool = true;
        append_tool_output(m.content, out);
        break;
    }
  }
  if (o.add_generation_prompt && is_last_user && !is_tool) {
    out += kAssistant;
    out += o.thinking ? kThinkOpen : kThinkClose;
  }
  return out;
}

}  // namespace

std::optional<TemplateFamily> parse_template_family(std::string_view name) {
  if (name == "v3") return TemplateFamily::kV3;
  if (name == "v31" || name == "v3.1") return TemplateFamily::kV31;
  if (name == "r1") return TemplateFamily::kR1;
  return std::nullopt;
}

const char* template_family_name(TemplateFamily family) {
  switch (family) {
    case TemplateFamily::kV3:
      return "v3";
    case TemplateFamily::kV31:
      return "v31";
    case TemplateFamily::kR1:
      return "r1";
  }
  return "v3";
}

TemplateFamily template_family_of(std::string_view t) {
  if (t.find("thinking") != std::string_view::npos && t.find("</think>") != std::string_view::npos)
    return TemplateFamily::kV31;
  if (t.find("<think>") != std::string_view::npos) return TemplateFamily::kR1;
  return TemplateFamily::kV3;
}

TemplateFamily detect_template_family(const std::string& model_dir) {
  const auto path = std::filesystem::path(model_dir) / "tokenizer_config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(StatusCode::kNotFound, "cannot open " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(StatusCode::kDataLoss, path.string() + ": invalid JSON: " + e.what());
  }
  std::string tmpl;
  if (cfg.contains("chat_template")) {
    const auto& ct = cfg["chat_template"];
    if (ct.is_string()) {
      tmpl = ct.get<std::string>();
    } else if (ct.is_array()) {
      for (const auto& e : ct)
        if (e.is_object() && e.value("name", "") == "default") tmpl = e.value("template", "");
    }
  }
  if (tmpl.empty()) throw Error(StatusCode::kDataLoss, path.string() + ": no chat_template");
  return template_family_of(tmpl);
}

std::string render_prompt(TemplateFamily family, const Conversation& conversation, const RenderOptions& options,
                          const std::string& bos_token) {
  switch (family) {
    case TemplateFamily::kV3:
      return render_v3(conversation, options, bos_token);
    case TemplateFamily::kV31:
      return render_v31(conversation, options, bos_token);
    case TemplateFamily::kR1:
      return render_r1(conversation, options, bos_token);
  }
  return render_v3(conversation, options, bos_token);
}

bool prompt_starts_in_reasoning(TemplateFamily family, const RenderOptions& options, std::string_view prompt) {
  if (family == TemplateFamily::kV3) return false;
  // The generation prompt opens reasoning when it ends with <think> (R1 adds a newline).
  while (!prompt.empty() && (prompt.back() == '\n' || prompt.back() == ' ')) prompt.remove_suffix(1);
  if (prompt.size() < kThinkOpen.size() || prompt.substr(prompt.size() - kThinkOpen.size()) != kThinkOpen) return false;
  return family == TemplateFamily::kR1 || options.thinking;
}

}  // namespace dsinfer::codec
