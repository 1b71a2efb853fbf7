// dsinfer generate: offline inference. One JSON line per prompt, in input order.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "core/status.h"
#include "dsinfer/llm.h"
#include "engine_options.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {
namespace {

std::vector<TokenId> parse_id_list(const std::string& text) {
  std::vector<TokenId> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX)
      throw Error("--prompt-ids: '" + item + "' is not a token id");
    ids.push_back(static_cast<TokenId>(v));
  }
  if (ids.empty()) throw Error("--prompt-ids: no ids given");
  return ids;
}

std::vector<TokenId> encode_prompt(const Tokenizer* tok, const std::string& text) {
  if (tok == nullptr) throw Error("a text prompt needs tokenizer.json in the model directory");
  return tok->encode_prompt(text);
}

template <typename T>
void read_optional(const nlohmann::json& j, const char* key, T& out, int line) {
  if (!j.contains(key) || j[key].is_null()) return;
  try {
    out = j[key].get<T>();
  } catch (const std::exception&) {
    throw Error("input line " + std::to_string(line) + ": '" + key + "' has the wrong type");
  }
}

int run_generate(int argc, char** argv) {
  CLI::App app("Offline generation: one JSON line per prompt, in input order", "dsinfer generate");
  EngineOptions eo;
  add_engine_options(app, eo);
  std::string prompt, prompt_ids, input;
  SamplingParams sp;
  sp.max_tokens = 16;
  std::optional<uint64_t> seed;
  auto* g = app.add_option_group("input", "exactly one prompt source");
  g->add_option("--prompt", prompt, "prompt text");
  g->add_option("--prompt-ids", prompt_ids, "comma-separated token ids");
  g->add_option("--input", input, "JSONL file of {\"prompt\":...} or {\"prompt_ids\":[...]}");
  g->require_option(1);
  app.add_option("--max-tokens", sp.max_tokens, "tokens to generate")->check(CLI::Range(1, 1 << 24));
  app.add_option("--temperature", sp.temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-p", sp.top_p)->check(CLI::Range(0.0, 1.0));
  app.add_option("--top-k", sp.top_k, "0 = off")->check(CLI::Range(0, 1 << 24));
  app.add_option("--min-p", sp.min_p)->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", seed, "per-request seed (each input line may override)");
  app.add_flag("--ignore-eos", sp.ignore_eos, "keep generating past end-of-sequence");
  app.add_option("--logprobs", sp.num_logprobs, "top-K log-probabilities per token")->check(CLI::Range(0, 20));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  sp.seed = seed;
  EngineConfig config = finish_engine_options(eo);

  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = Tokenizer::load(config.model_dir);
  } catch (const Error& e) {
    if (e.code() != StatusCode::kNotFound) throw;  // a broken tokenizer is an error; none is fine
  }

  std::vector<GenerationRequest> requests;
  if (!input.empty()) {
    std::ifstream f(input);
    if (!f) throw Error("cannot open --input file " + input);
    std::string line;
    int line_no = 0;
    while (std::getline(f, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception& e) {
        throw Error("input line " + std::to_string(line_no) + ": malformed JSON: " + e.what());
      }
      if (!j.is_object()) throw Error("input line " + std::to_string(line_no) + ": expected a JSON object");
      GenerationRequest r;
      r.sampling = sp;
      if (j.contains("prompt_ids")) {
        read_optional(j, "prompt_ids", r.prompt_ids, line_no);
      } else if (j.contains("prompt") && j["prompt"].is_string()) {
        r.prompt_ids = encode_prompt(tokenizer.get(), j["prompt"].get<std::string>());
      } else {
        throw Error("input line " + std::to_string(line_no) + ": needs \"prompt\" (string) or \"prompt_ids\"");
      }
      read_optional(j, "max_tokens", r.sampling.max_tokens, line_no);
      read_optional(j, "temperature", r.sampling.temperature, line_no);
      read_optional(j, "top_p", r.sampling.top_p, line_no);
      read_optional(j, "top_k", r.sampling.top_k, line_no);
      read_optional(j, "min_p", r.sampling.min_p, line_no);
      uint64_t line_seed = 0;
      if (j.contains("seed") && !j["seed"].is_null()) {
        read_optional(j, "seed", line_seed, line_no);
        r.sampling.seed = line_seed;
      }
      requests.push_back(std::move(r));
    }
  } else {
    GenerationRequest r;
    r.sampling = sp;
    r.prompt_ids = prompt_ids.empty() ? encode_prompt(tokenizer.get(), prompt) : parse_id_list(prompt_ids);
    requests.push_back(std::move(r));
  }

  LLM llm(config);
  const std::vector<Completion> results = llm.generate(requests);
  int exit_code = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const Completion& c = results[i];
    nlohmann::ordered_json out;  // keys in the documented order
    out["index"] = i;
    out["prompt_ids"] = c.prompt_ids;
    if (!c.status.ok()) {
      out["error"] = c.status.message();
      exit_code = 1;
    } else {
      out["token_ids"] = c.token_ids;
      out["text"] = tokenizer ? tokenizer->decode(c.token_ids, true) : std::string();
      out["finish_reason"] = finish_reason_name(c.finish_reason);
      if (sp.num_logprobs > 0 || !c.logprobs.empty()) {
        nlohmann::ordered_json lps = nlohmann::ordered_json::array();
        for (const auto& lp : c.logprobs) {
          nlohmann::ordered_json top = nlohmann::ordered_json::array();
          for (const auto& [id, v] : lp.top) top.push_back({{"id", id}, {"logprob", v}});
          lps.push_back({{"id", lp.token_id}, {"logprob", lp.logprob}, {"top", top}});
        }
        out["logprobs"] = lps;
      }
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  std::cout.flush();
  return exit_code;
}

}  // namespace

DSINFER_REGISTER_COMMAND(generate, "generate", "offline generation from prompts (JSON lines out)", run_generate);

}  // namespace dsinfer::cli
