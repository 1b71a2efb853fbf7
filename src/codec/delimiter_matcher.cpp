#include "codec/delimiter_matcher.h"

#include <deque>

namespace dsinfer::codec {

DelimiterMatcher::DelimiterMatcher(const std::vector<std::string>& delimiters) : delimiters_(delimiters) {
  for (size_t k = 0; k < delimiters_.size(); ++k) {
    const std::string& d = delimiters_[k];
    if (d.empty()) continue;
    int32_t node = 0;
    for (char ch : d) {
      const auto b = static_cast<uint8_t>(ch);
      int32_t next = find_edge(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[node].edges.emplace_back(b, next);
        nodes_.push_back(Node{});
        nodes_.back().depth = nodes_[node].depth + 1;
      }
      node = next;
    }
    // Two equal delimiters: the first one listed keeps the node.
    if (nodes_[node].output < 0) nodes_[node].output = static_cast<int32_t>(k);
  }
  // Breadth-first: failure links, and outputs inherited from the longest proper suffix that
  // ends a delimiter (kept only when the node has none of its own, which is longer).
  std::deque<int32_t> queue;
  for (const auto& [b, child] : nodes_[0].edges) {
    nodes_[child].fail = 0;
    queue.push_back(child);
  }
  while (!queue.empty()) {
    const int32_t n = queue.front();
    queue.pop_front();
    for (const auto& [b, child] : nodes_[n].edges) {
      int32_t f = nodes_[n].fail;
      while (f > 0 && find_edge(f, b) < 0) f = nodes_[f].fail;
      const int32_t target = find_edge(f, b);
      nodes_[child].fail = (target >= 0 && target != child) ? target : 0;
      if (nodes_[child].output < 0) nodes_[child].output = nodes_[nodes_[child].fail].output;
      queue.push_back(child);
    }
  }
}

int32_t DelimiterMatcher::find_edge(int32_t node, uint8_t b) const {
  for (const auto& [byte, next] : nodes_[node].edges)
    if (byte == b) return next;
  return -1;
}

DelimiterMatcher::Step DelimiterMatcher::push(uint8_t byte) {
  int32_t n = node_;
  for (;;) {
    const int32_t next = find_edge(n, byte);
    if (next >= 0) {
      n = next;
      break;
    }
    if (n == 0) break;
    n = nodes_[n].fail;
  }
  node_ = n;
  Step s;
  s.num_held_bytes = static_cast<size_t>(nodes_[n].depth);
  s.matched = nodes_[n].output;
  return s;
}

}  // namespace dsinfer::codec
