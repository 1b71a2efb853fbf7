// Token sampling on the host: greedy, temperature, top-k, top-p, min-p, with a per-request
// random stream so that a request's draws never depend on the rest of the batch.
#pragma once

#include <cstdint>

#include "backend/token_choice.h"
#include "dsinfer/engine_types.h"

namespace dsinfer {

// SplitMix64-seeded xoshiro256**: small, fast, and identical on every platform.
class SamplerState {
 public:
  SamplerState() : SamplerState(0) {}
  explicit SamplerState(uint64_t seed);
  uint64_t next_u64();
  double next_uniform();  // [0, 1)

 private:
  uint64_t s_[4];
};

// A request's parameters for one row, with the uniform draw taken from its stream (one draw per
// non-greedy row, none for greedy ones): what choose_token or Backend::sample_rows needs.
RowSampling row_sampling(const SamplingParams& p, SamplerState& state);

// The chosen token's log-probability under the unmodified model distribution, and the top
// num_top tokens' (ties by id), from logits [vocab]; no full sort.
void token_logprobs(const float* logits, int vocab, TokenId chosen, int num_top, TokenLogprob* out);

// Samples one token from logits [vocab] (choose_token with row_sampling's draw). Fills *logprob
// (when non-null) with the chosen token's log-probability under the unmodified model
// distribution and the top num_logprobs tokens.
TokenId sample_token(const float* logits, int vocab, const SamplingParams& params, SamplerState& state,
                     TokenLogprob* logprob);

}  // namespace dsinfer
