// The pre-tokenizer of a HF tokenizer.json: a Sequence of Split steps (PCRE2 regexes, JIT
// compiled, Unicode properties on) followed by ByteLevel without its own regex. It cuts a
// text into pieces; BPE then runs on each piece's bytes independently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsinfer::tok {

struct Span {
  uint32_t begin = 0;
  uint32_t length = 0;
};

class PreTokenizer {
 public:
  // Builds from the "pre_tokenizer" object of tokenizer.json (null means: no splitting).
  // Throws dsinfer::Error on a step type or regex it cannot handle.
  explicit PreTokenizer(const nlohmann::json& config);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the pieces of text (valid UTF-8) to out, as spans relative to text, in order,
  // covering text exactly. Thread-safe.
  void split(std::string_view text, std::vector<Span>& out) const;

  int num_split_steps() const { return static_cast<int>(steps_.size()); }

 private:
  struct Step;
  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace dsinfer::tok
