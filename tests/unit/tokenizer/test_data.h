// Where the tokenizer tests find the DeepSeek-V3 tokenizer (installed by npm ci in
// tests/tokenizer_oracle, see scripts/test.sh) and one shared loaded instance.
#pragma once

#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace dsinfer::testing {

std::string deepseek_v3_tokenizer_dir();
std::string tokenizer_oracle_dir();
// Loaded once per test binary; fails the test (not skips) when the data is missing.
const Tokenizer& deepseek_v3_tokenizer();

}  // namespace dsinfer::testing
