// Finds added tokens (special and not) in a text in one left-to-right pass: at each
// position the longest token that starts there wins, and scanning resumes after it — the
// leftmost-longest rule of HF tokenizers and transformers.js.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsinfer::tok {

class SpecialTokenMatcher {
 public:
  struct Match {
    size_t begin = 0;
    size_t length = 0;
    int32_t id = 0;
  };

  void add(std::string_view content, int32_t id);

  // Appends the matches in text, in order, non-overlapping.
  void find_all(std::string_view text, std::vector<Match>& out) const;

  bool empty() const { return nodes_.size() <= 1; }

 private:
  // A byte trie: children are kept in a flat edge list per node (added tokens are few and
  // mostly share long prefixes), with a table of which bytes can start a token so that the
  // scan skips everything else with memchr-like speed.
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> edges;  // (byte, child node)
    int32_t token_id = -1;
  };
  int32_t child(int32_t node, uint8_t b) const;

  std::vector<Node> nodes_{1};
  bool first_byte_[256] = {};
  int num_first_bytes_ = 0;
  uint8_t only_first_byte_ = 0;
};

}  // namespace dsinfer::tok
