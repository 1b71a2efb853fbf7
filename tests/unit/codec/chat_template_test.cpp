#include "codec/chat_template.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "codec/openai_conversation.h"

namespace dsinfer::codec {
namespace {

const std::string kBos = "<｜begin▁of▁sentence｜>";
const std::string kEos = "<｜end▁of▁sentence｜>";

// A Conversation as the templates' `messages` (the mapping documented in chat_template.h).
nlohmann::json to_template_messages(const Conversation& c) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : c.messages) {
    nlohmann::json j;
    switch (m.role) {
      case Role::kSystem: j["role"] = "system"; break;
      case Role::kUser: j["role"] = "user"; break;
      case Role::kAssistant: j["role"] = "assistant"; break;
      case Role::kTool: j["role"] = "tool"; break;
    }
    const bool none = m.role == Role::kAssistant && !m.tool_calls.empty() && m.content.empty();
    j["content"] = none ? nlohmann::json(nullptr) : nlohmann::json(m.content);
    if (!m.tool_calls.empty()) {
      j["tool_calls"] = nlohmann::json::array();
      for (const auto& tc : m.tool_calls)
        j["tool_calls"].push_back({{"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments_json}}}});
    }
    if (m.role == Role::kTool) j["tool_call_id"] = m.tool_call_id;
    out.push_back(j);
  }
  return out;
}

std::string pick(std::mt19937& rng, const std::vector<std::string>& v) { return v[rng() % v.size()]; }

// Random conversations that walk through every branch of the templates: several system
// messages anywhere, tool-call turns with and without content, runs of tool outputs, earlier
// reasoning in assistant content, consecutive users, and conversations ending on any role.
std::vector<Conversation> generate_conversations(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<std::string> texts = {"Hello!", "What is 2+2?", "你好，世界", "line1\nline2", "", "  spaced  ",
                                          "emoji 👩🏽‍💻", "Use `code` and ```fences```", "<b>html</b>", "tabs\tand\r\nCRLF"};
  const std::vector<std::string> answers = {"4", "Sure.", "<think>hmm</think>The answer.", "a</think>b</think>c",
                                            "Reasoning\n</think>\n\nFinal", "", "多语言回答"};
  const std::vector<std::string> names = {"get_weather", "search", "calc"};
  const std::vector<std::string> args = {"{\"city\": \"Paris\"}", "{}", "{\"q\": \"a \\\"quoted\\\" term\"}", "{\"x\": [1, 2]}"};
  std::vector<Conversation> out;
  for (int i = 0; i < n; ++i) {
    Conversation c;
    const int len = 1 + static_cast<int>(rng() % 9);
    bool pending_tools = false;
    for (int k = 0; k < len; ++k) {
      const int r = static_cast<int>(rng() % 10);
      Message m;
      if (pending_tools && r < 6) {
        const int num = 1 + static_cast<int>(rng() % 3);
        for (int t = 0; t < num; ++t) {
          Message tool;
          tool.role = Role::kTool;
          tool.content = pick(rng, {"{\"temp\": 21}", "result text", "", "多"});
          tool.tool_call_id = "call_" + std::to_string(t);
          c.messages.push_back(tool);
        }
        pending_tools = false;
        continue;
      }
      if (r == 0) {
        m.role = Role::kSystem;
        m.content = pick(rng, {"You are helpful.", "Be brief.", "系统提示", ""});
      } else if (r <= 4) {
        m.role = Role::kUser;
        m.content = pick(rng, texts);
      } else if (r <= 7) {
        m.role = Role::kAssistant;
        m.content = pick(rng, answers);
      } else {
        m.role = Role::kAssistant;
        if (rng() % 3 == 0) m.content = pick(rng, {"Let me check.", "ok"});
        const int num = 1 + static_cast<int>(rng() % 3);
        for (int t = 0; t < num; ++t) m.tool_calls.push_back({"call_" + std::to_string(t), pick(rng, names), pick(rng, args)});
        pending_tools = true;
      }
      c.messages.push_back(m);
    }
    out.push_back(std::move(c));
  }
  return out;
}

struct Case {
  TemplateFamily family;
  RenderOptions options;
  Conversation conversation;
};

TEST(ChatTemplate, ByteIdenticalToJinja2OnGeneratedConversations) {
  const auto conversations = generate_conversations(80, 42);
  std::vector<Case> cases;
  for (const auto& c : conversations) {
    for (TemplateFamily f : {TemplateFamily::kV3, TemplateFamily::kV31, TemplateFamily::kR1}) {
      for (bool gen : {true, false}) {
        for (bool thinking : {false, true}) {
          if (thinking && f != TemplateFamily::kV31) continue;
          cases.push_back({f, RenderOptions{gen, thinking}, c});
        }
      }
    }
  }
  const auto dir = std::filesystem::temp_directory_path() / ("dsinfer_tmpl_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream in(dir / "in.jsonl");
    for (const auto& k : cases) {
      nlohmann::json j = {{"family", template_family_name(k.family)},
                          {"messages", to_template_messages(k.conversation)},
                          {"add_generation_prompt", k.options.add_generation_prompt},
                          {"thinking", k.options.thinking},
                          {"bos_token", kBos},
                          {"eos_token", kEos}};
      in << j.dump() << "\n";
    }
  }
  const std::string src = DSINFER_SOURCE_DIR;
  const std::string cmd = "python3 '" + src + "/tests/data/templates/render.py' '" + src + "/tests/data/templates' '" +
                          (dir / "in.jsonl").string() + "' '" + (dir / "out.jsonl").string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream out(dir / "out.jsonl");
  std::string line;
  size_t i = 0, mismatches = 0;
  while (std::getline(out, line)) {
    ASSERT_LT(i, cases.size());
    const std::string expected = nlohmann::json::parse(line).get<std::string>();
    const std::string got = render_prompt(cases[i].family, cases[i].conversation, cases[i].options, kBos);
    if (got != expected && ++mismatches <= 5) {
      ADD_FAILURE() << template_family_name(cases[i].family) << " gen=" << cases[i].options.add_generation_prompt
                    << " thinking=" << cases[i].options.thinking << "\nmessages: "
                    << to_template_messages(cases[i].conversation).dump() << "\n ours: " << nlohmann::json(got).dump()
                    << "\njinja: " << nlohmann::json(expected).dump();
    }
    ++i;
  }
  EXPECT_EQ(i, cases.size());
  EXPECT_EQ(mismatches, 0u) << "of " << cases.size() << " renders (" << conversations.size() << " conversations)";
  std::filesystem::remove_all(dir);
}

TEST(ChatTemplate, FamilyNamesAndDetection) {
  EXPECT_EQ(parse_template_family("v3"), TemplateFamily::kV3);
  EXPECT_EQ(parse_template_family("v31"), TemplateFamily::kV31);
  EXPECT_EQ(parse_template_family("r1"), TemplateFamily::kR1);
  EXPECT_FALSE(parse_template_family("v4").has_value());
  const std::string src = DSINFER_SOURCE_DIR;
  for (auto [file, family] : {std::pair{"deepseek_v3.jinja", TemplateFamily::kV3}, std::pair{"deepseek_v31.jinja", TemplateFamily::kV31},
                              std::pair{"deepseek_r1.jinja", TemplateFamily::kR1}}) {
    std::ifstream in(src + "/tests/data/templates/" + file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(template_family_of(text), family) << file;
  }
}

TEST(ChatTemplate, StartsInReasoning) {
  Conversation c;
  c.messages.push_back({Role::kUser, "hi", std::nullopt, {}, ""});
  const RenderOptions think{true, true}, no_think{true, false};
  EXPECT_TRUE(prompt_starts_in_reasoning(TemplateFamily::kR1, no_think, render_prompt(TemplateFamily::kR1, c, no_think, kBos)));
  EXPECT_TRUE(prompt_starts_in_reasoning(TemplateFamily::kV31, think, render_prompt(TemplateFamily::kV31, c, think, kBos)));
  EXPECT_FALSE(prompt_starts_in_reasoning(TemplateFamily::kV31, no_think, render_prompt(TemplateFamily::kV31, c, no_think, kBos)));
  EXPECT_FALSE(prompt_starts_in_reasoning(TemplateFamily::kV3, think, render_prompt(TemplateFamily::kV3, c, think, kBos)));
}

TEST(OpenAiConversation, ParsesMessagesAndTools) {
  const auto body = nlohmann::json::parse(R"({
    "messages": [
      {"role": "developer", "content": "sys"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "reasoning_content": "r",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "out"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
  })");
  auto r = conversation_from_openai_json(body);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Conversation& c = r.value();
  ASSERT_EQ(c.messages.size(), 4u);
  EXPECT_EQ(c.messages[0].role, Role::kSystem);
  EXPECT_EQ(c.messages[1].content, "ab");
  EXPECT_EQ(c.messages[2].tool_calls.at(0).arguments_json, "{\"x\":1}");
  EXPECT_EQ(c.messages[2].reasoning_content, "r");
  EXPECT_EQ(c.messages[3].tool_call_id, "c1");
  ASSERT_EQ(c.tools.size(), 1u);
  EXPECT_EQ(c.tools[0].parameters_json, "{\"type\":\"object\"}");
}

TEST(OpenAiConversation, RejectsBadInput) {
  for (const char* bad : {R"([])", R"({})", R"({"messages": 3})", R"({"messages": [{"role": "wizard", "content": "x"}]})",
                          R"({"messages": [{"content": "x"}]})", R"({"messages": [{"role": "user", "content": 5}]})",
                          R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
                          R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]})",
                          R"({"messages": [], "tools": [{"type": "function"}]})"}) {
    auto r = conversation_from_openai_json(nlohmann::json::parse(bad));
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace dsinfer::codec
