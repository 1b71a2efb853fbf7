// `dsinfer tokenize` and `dsinfer detokenize`: the tokenizer and prompt renderer from the
// command line (see DESIGN.md for the contract).
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "codec/chat_template.h"
#include "codec/openai_conversation.h"
#include "command.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {
namespace {

std::string dump_json(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return true;
}

int usage_error(const char* cmd, const std::string& msg) {
  std::fprintf(stderr, "dsinfer %s: %s (see --help)\n", cmd, msg.c_str());
  return 2;
}

int run_tokenize(int argc, char** argv) {
  std::string model, text, file, chat, tmpl;
  bool have_text = false, add_generation_prompt = false, thinking = false, no_special = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string& dst) {
      if (i + 1 >= argc) return false;
      dst = argv[++i];
      return true;
    };
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: dsinfer tokenize --model DIR (--text S | --file F | --chat FILE.json [--add-generation-prompt])\n"
          "                        [--template v3|v31|r1] [--thinking] [--no-special]\n"
          "Prints {\"ids\":[...],\"prompt\":\"...\"}. No BOS is added to --text/--file; the chat template adds its own.\n"
          "--chat takes {\"messages\":[...],\"tools\":[...]} in OpenAI form; the template family comes from\n"
          "tokenizer_config.json unless --template is given. --thinking opens reasoning in V3.1's generation\n"
          "prompt. --no-special encodes added-token text in --text/--file as plain text.\n");
      return 0;
    } else if (a == "--model") {
      if (!value(model)) return usage_error("tokenize", "--model needs a value");
    } else if (a == "--text") {
      if (!value(text)) return usage_error("tokenize", "--text needs a value");
      have_text = true;
    } else if (a == "--file") {
      if (!value(file)) return usage_error("tokenize", "--file needs a value");
    } else if (a == "--chat") {
      if (!value(chat)) return usage_error("tokenize", "--chat needs a value");
    } else if (a == "--template") {
      if (!value(tmpl)) return usage_error("tokenize", "--template needs a value");
    } else if (a == "--add-generation-prompt") {
      add_generation_prompt = true;
    } else if (a == "--thinking") {
      thinking = true;
    } else if (a == "--no-special") {
      no_special = true;
    } else {
      return usage_error("tokenize", "unknown option '" + a + "'");
    }
  }
  if (model.empty()) model = default_model_dir();
  const int num_inputs = (have_text ? 1 : 0) + (file.empty() ? 0 : 1) + (chat.empty() ? 0 : 1);
  if (num_inputs != 1) return usage_error("tokenize", "give exactly one of --text, --file, --chat");
  std::optional<codec::TemplateFamily> family;
  if (!tmpl.empty()) {
    family = codec::parse_template_family(tmpl);
    if (!family) return usage_error("tokenize", "--template must be v3, v31 or r1");
  }
  auto tokenizer = Tokenizer::load(model);
  std::string prompt;
  bool allow_special = !no_special;
  if (!chat.empty()) {
    std::string body_text;
    if (!read_file(chat, body_text)) return usage_error("tokenize", "cannot read " + chat);
    nlohmann::json body;
    try {
      body = nlohmann::json::parse(body_text);
    } catch (const nlohmann::json::exception& e) {
      std::fprintf(stderr, "dsinfer tokenize: %s: invalid JSON: %s\n", chat.c_str(), e.what());
      return 1;
    }
    auto conv = codec::conversation_from_openai_json(body);
    if (!conv.ok()) {
      std::fprintf(stderr, "dsinfer tokenize: %s: %s\n", chat.c_str(), conv.status().message().c_str());
      return 1;
    }
    if (!family) family = codec::detect_template_family(model);
    codec::RenderOptions options;
    options.add_generation_prompt = add_generation_prompt;
    options.thinking = thinking;
    prompt = codec::render_prompt(*family, conv.value(), options, tokenizer->bos_token());
    allow_special = true;  // the rendered prompt's control tokens must be tokens
  } else if (!file.empty()) {
    if (!read_file(file, prompt)) return usage_error("tokenize", "cannot read " + file);
  } else {
    prompt = text;
  }
  const auto ids = tokenizer->encode(prompt, allow_special);
  std::cout << dump_json({{"ids", ids}, {"prompt", prompt}}) << "\n";
  return 0;
}

int run_detokenize(int argc, char** argv) {
  std::string model, ids_text;
  bool skip_special = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("usage: dsinfer detokenize --model DIR --ids 1,2,3 [--skip-special]\nPrints {\"text\":\"...\"}.\n");
      return 0;
    } else if (a == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--ids" && i + 1 < argc) {
      ids_text = argv[++i];
    } else if (a == "--skip-special") {
      skip_special = true;
    } else {
      return usage_error("detokenize", "unknown or incomplete option '" + a + "'");
    }
  }
  if (model.empty()) model = default_model_dir();
  std::vector<int32_t> ids;
  std::stringstream ss(ids_text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || errno != 0 || v < 0 || v > INT32_MAX)
      return usage_error("detokenize", "bad id '" + item + "' in --ids");
    ids.push_back(static_cast<int32_t>(v));
  }
  auto tokenizer = Tokenizer::load(model);
  for (int32_t id : ids) {
    if (id >= tokenizer->vocab_size())
      return usage_error("detokenize", "id " + std::to_string(id) + " is outside the vocabulary (size " +
                                           std::to_string(tokenizer->vocab_size()) + ")");
  }
  std::cout << dump_json({{"text", tokenizer->decode(ids, skip_special)}}) << "\n";
  return 0;
}

}  // namespace
}  // namespace dsinfer::cli

DSINFER_REGISTER_COMMAND(tokenize, "tokenize", "text or an OpenAI chat → token ids (and the rendered prompt)",
                         dsinfer::cli::run_tokenize);
DSINFER_REGISTER_COMMAND(detokenize, "detokenize", "token ids → text", dsinfer::cli::run_detokenize);
