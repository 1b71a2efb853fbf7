#include "tokenizer/special_token_matcher.h"

#include <cstring>

namespace dsinfer::tok {

int32_t SpecialTokenMatcher::child(int32_t node, uint8_t b) const {
  for (const auto& [byte, next] : nodes_[node].edges)
    if (byte == b) return next;
  return -1;
}

void SpecialTokenMatcher::add(std::string_view content, int32_t id) {
  if (content.empty()) return;
  int32_t node = 0;
  for (char ch : content) {
    const auto b = static_cast<uint8_t>(ch);
    int32_t next = child(node, b);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_[node].edges.emplace_back(b, next);
      nodes_.emplace_back();
    }
    node = next;
  }
  nodes_[node].token_id = id;
  const auto b0 = static_cast<uint8_t>(content[0]);
  if (!first_byte_[b0]) {
    first_byte_[b0] = true;
    ++num_first_bytes_;
    only_first_byte_ = b0;
  }
}

void SpecialTokenMatcher::find_all(std::string_view text, std::vector<Match>& out) const {
  if (empty()) return;
  const size_t n = text.size();
  const auto* data = reinterpret_cast<const uint8_t*>(text.data());
  size_t i = 0;
  while (i < n) {
    if (num_first_bytes_ == 1) {
      const void* hit = std::memchr(data + i, only_first_byte_, n - i);
      if (hit == nullptr) return;
      i = static_cast<const uint8_t*>(hit) - data;
    } else {
      while (i < n && !first_byte_[data[i]]) ++i;
      if (i >= n) return;
    }
    int32_t node = 0;
    size_t best_len = 0;
    int32_t best_id = -1;
    for (size_t j = i; j < n; ++j) {
      node = child(node, data[j]);
      if (node < 0) break;
      if (nodes_[node].token_id >= 0) {
        best_len = j - i + 1;
        best_id = nodes_[node].token_id;
      }
    }
    if (best_id >= 0) {
      out.push_back({i, best_len, best_id});
      i += best_len;
    } else {
      ++i;
    }
  }
}

}  // namespace dsinfer::tok
