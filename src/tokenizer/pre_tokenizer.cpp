#include "tokenizer/pre_tokenizer.h"

#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace dsinfer::tok {
namespace {

// Per-thread PCRE2 match state: match data and a JIT stack large enough for long runs of
// whitespace or letters (the default 32 KiB stack can overflow on megabyte-long pieces).
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

SplitBehavior parse_behavior(const std::string& s) {
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  throw Error("tokenizer.json: unknown Split behavior '" + s + "'");
}

std::string escape_literal(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.[]|()?*+{}").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace

struct PreTokenizer::Step {
  pcre2_code* code = nullptr;
  bool jit = false;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  ~Step() { pcre2_code_free(code); }

  // Calls on_match(begin, end) for each non-empty match of the regex in subject.
  template <typename Fn>
  void for_each_match(std::string_view subject, Fn&& on_match) const {
    MatchState& st = match_state();
    size_t pos = 0;
    const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    while (pos < subject.size()) {
      // The text was validated by the caller: skip PCRE2's own UTF check.
      const int rc = jit ? pcre2_jit_match(code, s, subject.size(), pos, PCRE2_NO_UTF_CHECK, st.data, st.context)
                         : pcre2_match(code, s, subject.size(), pos, PCRE2_NO_UTF_CHECK, st.data, st.context);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) throw Error(StatusCode::kInternal, "pre-tokenizer regex failed (PCRE2 error " + std::to_string(rc) + ")");
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
      const size_t b = ov[0], e = ov[1];
      if (e > b) {
        on_match(b, e);
        pos = e;
      } else {
        // An empty match: step over one character so the scan makes progress.
        pos = b + 1;
        while (pos < subject.size() && (static_cast<uint8_t>(subject[pos]) & 0xC0) == 0x80) ++pos;
      }
    }
  }

  void split(std::string_view text, uint32_t base, std::vector<Span>& out) const {
    // Collect the pieces as alternating (gap, match) spans, then apply the behaviour.
    uint32_t prev = 0;
    // Pieces are pushed as they are decided; "merged" behaviours hold one pending span.
    auto emit = [&](uint32_t b, uint32_t e) {
      if (e > b) out.push_back({base + b, e - b});
    };
    switch (behavior) {
      case SplitBehavior::kIsolated:
        for_each_match(text, [&](size_t b, size_t e) {
          emit(prev, b);
          emit(b, e);
          prev = static_cast<uint32_t>(e);
        });
        emit(prev, static_cast<uint32_t>(text.size()));
        break;
      case SplitBehavior::kRemoved:
        for_each_match(text, [&](size_t b, size_t e) {
          emit(prev, b);
          prev = static_cast<uint32_t>(e);
        });
        emit(prev, static_cast<uint32_t>(text.size()));
        break;
      case SplitBehavior::kMergedWithPrevious:
        for_each_match(text, [&](size_t b, size_t e) {
          emit(prev, e);
          prev = static_cast<uint32_t>(e);
        });
        emit(prev, static_cast<uint32_t>(text.size()));
        break;
      case SplitBehavior::kMergedWithNext:
        for_each_match(text, [&](size_t b, size_t e) {
          emit(prev, b);
          prev = static_cast<uint32_t>(b);
        });
        emit(prev, static_cast<uint32_t>(text.size()));
        break;
      case SplitBehavior::kContiguous: {
        uint32_t run_begin = 0, run_end = 0;
        bool in_run = false;
        for_each_match(text, [&](size_t b, size_t e) {
          if (in_run && run_end == b) {
            run_end = static_cast<uint32_t>(e);
            prev = run_end;
            return;
          }
          if (in_run) emit(run_begin, run_end);
          emit(prev, b);
          run_begin = static_cast<uint32_t>(b);
          run_end = static_cast<uint32_t>(e);
          in_run = true;
          prev = run_end;
        });
        if (in_run) emit(run_begin, run_end);
        emit(prev, static_cast<uint32_t>(text.size()));
        break;
      }
    }
  }
};

PreTokenizer::PreTokenizer(const nlohmann::json& config) {
  if (config.is_null()) return;
  std::vector<const nlohmann::json*> list;
  const std::string type = config.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : config.at("pretokenizers")) list.push_back(&p);
  } else {
    list.push_back(&config);
  }
  for (const auto* p : list) {
    const std::string t = p->value("type", "");
    if (t == "ByteLevel") {
      // Only the byte mapping is supported; a ByteLevel step with its own GPT-2 regex or a
      // prefix space would change the pieces.
      if (p->value("add_prefix_space", false) || p->value("use_regex", true))
        throw Error("tokenizer.json: ByteLevel pre-tokenizer with add_prefix_space or use_regex is not supported");
      continue;
    }
    if (t != "Split") throw Error("tokenizer.json: unsupported pre-tokenizer type '" + t + "'");
    auto step = std::make_unique<Step>();
    const auto& pattern = p->at("pattern");
    std::string regex;
    if (pattern.contains("Regex")) {
      regex = pattern.at("Regex").get<std::string>();
    } else {
      regex = escape_literal(pattern.at("String").get<std::string>());
    }
    step->behavior = parse_behavior(p->value("behavior", "Isolated"));
    if (p->value("invert", false)) throw Error("tokenizer.json: inverted Split pre-tokenizer is not supported");
    int err = 0;
    PCRE2_SIZE err_off = 0;
    step->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(regex.data()), regex.size(),
                               PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
    if (step->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      throw Error("tokenizer.json: cannot compile pre-tokenizer regex at offset " + std::to_string(err_off) + ": " +
                  reinterpret_cast<const char*>(msg));
    }
    step->jit = pcre2_jit_compile(step->code, PCRE2_JIT_COMPLETE) == 0;
    steps_.push_back(std::move(step));
  }
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<Span>& out) const {
  const size_t first = out.size();
  out.push_back({0, static_cast<uint32_t>(text.size())});
  if (text.empty()) {
    out.pop_back();
    return;
  }
  std::vector<Span> next;
  for (const auto& step : steps_) {
    next.clear();
    for (size_t i = first; i < out.size(); ++i) {
      const Span sp = out[i];
      step->split(text.substr(sp.begin, sp.length), sp.begin, next);
    }
    out.resize(first);
    out.insert(out.end(), next.begin(), next.end());
  }
}

}  // namespace dsinfer::tok
