#include "tokenizer/utf8.h"

namespace dsinfer::tok {
namespace {

// The well-formed byte ranges of Unicode table 3-7: for a lead byte, the allowed range of the
// second byte (later bytes are always 80..BF).
struct LeadInfo {
  uint8_t length;  // 0 = never valid as a lead byte
  uint8_t second_lo;
  uint8_t second_hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b < 0xED) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes of s (starting at a lead byte) that are a valid prefix of a sequence:
// the "maximal subpart" when the whole sequence is not there.
size_t valid_subpart_length(std::string_view s, const LeadInfo& info) {
  size_t n = 1;
  if (s.size() < 2) return n;
  const auto b1 = static_cast<uint8_t>(s[1]);
  if (b1 < info.second_lo || b1 > info.second_hi) return n;
  ++n;
  for (size_t k = 2; k < info.length && k < s.size(); ++k) {
    const auto b = static_cast<uint8_t>(s[k]);
    if (b < 0x80 || b > 0xBF) return n;
    ++n;
  }
  return n;
}

}  // namespace

size_t utf8_valid_sequence_length(std::string_view s) {
  if (s.empty()) return 0;
  const LeadInfo info = lead_info(static_cast<uint8_t>(s[0]));
  if (info.length == 0) return 0;
  if (info.length == 1) return 1;
  if (s.size() < info.length) return 0;
  return valid_subpart_length(s, info) == info.length ? info.length : 0;
}

size_t utf8_valid_prefix_length(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII fast path, eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = utf8_valid_sequence_length(s.substr(i));
    if (len == 0) return i;
    i += len;
  }
  return n;
}

size_t utf8_incomplete_tail_length(std::string_view s) {
  // A partial sequence is at most 3 bytes: look back for its lead byte.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<uint8_t>(s[n - back]);
    if (b >= 0x80 && b <= 0xBF) continue;  // continuation byte: keep looking
    const LeadInfo info = lead_info(b);
    if (info.length <= 1 || back >= info.length) return 0;
    // The tail is a prefix of a sequence that more bytes could complete only if every byte
    // so far is in range.
    return valid_subpart_length(s.substr(n - back), info) == back ? back : 0;
  }
  return 0;
}

void append_utf8_lossy(std::string_view s, std::string& out) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const size_t valid = utf8_valid_prefix_length(s.substr(i));
    out.append(s.data() + i, valid);
    i += valid;
    if (i >= n) break;
    const LeadInfo info = lead_info(static_cast<uint8_t>(s[i]));
    i += info.length == 0 ? 1 : valid_subpart_length(s.substr(i), info);
    out.append(kReplacementChar);
  }
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  append_utf8_lossy(s, out);
  return out;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t decode_utf8(std::string_view s, size_t* i) {
  const auto b0 = static_cast<uint8_t>(s[*i]);
  if (b0 < 0x80) {
    *i += 1;
    return b0;
  }
  const size_t len = b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
  uint32_t cp = b0 & (0x7F >> len);
  for (size_t k = 1; k < len && *i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[*i + k]) & 0x3F);
  *i += len;
  return cp;
}

}  // namespace dsinfer::tok
