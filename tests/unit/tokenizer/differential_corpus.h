// A deterministic corpus of test strings for the tokenizer: many scripts, emoji sequences,
// combining marks, digits, code, whitespace runs and added tokens inside text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsinfer::testing {

std::vector<std::string> tokenizer_differential_corpus(int num_strings, uint32_t seed);

}  // namespace dsinfer::testing
