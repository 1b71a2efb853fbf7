// DeepSeek prompt rendering, hand-written: V3, V3.1 (thinking and non-thinking) and R1, each
// byte-identical to that model's own tokenizer_config.json chat_template as rendered by
// Python jinja2 — including the templates' quirks (a tool-call "first" flag that is never
// reset, an unclosed single tool call in V3, tool definitions not rendered at all).
//
// How a Conversation maps to the templates' message dicts: an assistant message with tool
// calls and empty content is content=None (OpenAI's null); otherwise content is the string.
// reasoning_content is not rendered (the templates drop earlier reasoning).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "codec/conversation.h"

namespace dsinfer::codec {

enum class TemplateFamily { kV3, kV31, kR1 };

// "v3", "v31" (also "v3.1"), "r1".
std::optional<TemplateFamily> parse_template_family(std::string_view name);
const char* template_family_name(TemplateFamily family);

// The family of a chat_template text: V3.1 has the thinking switch, R1 opens <think> in its
// generation prompt, anything else is treated as V3.
TemplateFamily template_family_of(std::string_view chat_template);
// Reads model_dir/tokenizer_config.json's chat_template. Throws dsinfer::Error naming the
// file when it cannot be read.
TemplateFamily detect_template_family(const std::string& model_dir);

std::string render_prompt(TemplateFamily family, const Conversation& conversation, const RenderOptions& options,
                          const std::string& bos_token);

// Whether the model's output begins inside reasoning: the prompt ends by opening <think>
// (R1's generation prompt, V3.1 with thinking on).
bool prompt_starts_in_reasoning(TemplateFamily family, const RenderOptions& options, std::string_view prompt);

}  // namespace dsinfer::codec
