// Streaming multi-pattern matching (Aho-Corasick) for the output parser: bytes go in one at
// a time, each is looked at once, and the matcher says how many trailing bytes might still
// be the start of a delimiter (those must be held back) and when a delimiter has completed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsinfer::codec {

class DelimiterMatcher {
 public:
  DelimiterMatcher() = default;
  explicit DelimiterMatcher(const std::vector<std::string>& delimiters);

  struct Step {
    int matched = -1;           // index of the delimiter that ends at this byte, or -1
    size_t num_held_bytes = 0;  // trailing bytes (this one included) that are a delimiter prefix
  };
  // Advances the state by one byte. When several delimiters end here, the longest wins.
  Step push(uint8_t byte);
  void reset() { node_ = 0; }

  const std::string& delimiter(int index) const { return delimiters_[index]; }
  int num_delimiters() const { return static_cast<int>(delimiters_.size()); }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> edges;
    int32_t fail = 0;
    int32_t depth = 0;
    int32_t output = -1;  // longest delimiter ending at this node (own or via fail links)
  };
  int32_t find_edge(int32_t node, uint8_t b) const;

  std::vector<std::string> delimiters_;
  std::vector<Node> nodes_{1};
  int32_t node_ = 0;
};

}  // namespace dsinfer::codec
