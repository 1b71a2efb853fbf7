// The JSON of a token's log-probabilities in the shape OpenAI's Chat Completions
// (`logprobs.content[i]`) and Responses (`output_text.logprobs[i]`) share. Internal to src/codec.
#pragma once

#include <nlohmann/json.hpp>

#include "codec/token_logprobs.h"

namespace dsinfer::codec {

// {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}, ...]}
nlohmann::json openai_logprob_json(const TokenLogprobs& token);

}  // namespace dsinfer::codec
