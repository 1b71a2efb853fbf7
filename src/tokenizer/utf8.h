// UTF-8 helpers shared by the tokenizer, the streaming detokenizer and the output parser.
// Invalid input is never an error here: callers choose to split it off or to replace it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsinfer::tok {

// Length of the valid UTF-8 sequence starting at s[0] (1..4), or 0 when the bytes there are
// not a complete, well-formed sequence (overlongs, surrogates and > U+10FFFF are ill-formed).
size_t utf8_valid_sequence_length(std::string_view s);

// Length of the longest prefix of s that is valid UTF-8.
size_t utf8_valid_prefix_length(std::string_view s);

// How many bytes at the end of s form the start of a sequence that more bytes could still
// complete (0..3). Used to hold back a partial character while streaming.
size_t utf8_incomplete_tail_length(std::string_view s);

// Appends s to out, replacing each maximal ill-formed subpart with U+FFFD (the WHATWG /
// Unicode "maximal subpart" practice, which is what Python's and JavaScript's decoders do).
void append_utf8_lossy(std::string_view s, std::string& out);
std::string utf8_lossy(std::string_view s);

// Appends the UTF-8 encoding of code point cp.
void append_utf8(uint32_t cp, std::string& out);

// Decodes one code point from a valid sequence; advances *i.
uint32_t decode_utf8(std::string_view s, size_t* i);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

}  // namespace dsinfer::tok
