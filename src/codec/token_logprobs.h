// Log-probabilities of generated tokens as the OpenAI protocols report them (Chat Completions'
// `logprobs.content`, Completions' `logprobs`): each token's text and raw bytes with its
// log-probability under the model, and the most likely tokens at its position.
#pragma once

#include <string>
#include <vector>

namespace dsinfer::codec {

struct LogprobToken {
  std::string text;   // UTF-8; bytes that are not whole characters become U+FFFD
  std::string bytes;  // the token's raw bytes (a byte-level token may hold part of a character)
  float logprob = 0.0f;
};

struct TokenLogprobs {
  LogprobToken chosen;
  std::vector<LogprobToken> top;  // best first; empty unless alternatives were asked for
};

// The log-probability as a JSON number: OpenAI writes -9999 for a token of probability 0 (JSON
// has no -infinity).
inline double reported_logprob(float logprob) { return logprob >= -9999.0f ? logprob : -9999.0; }

}  // namespace dsinfer::codec
