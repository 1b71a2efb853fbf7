// Which token a row of logits yields under a request's sampling parameters, given one uniform
// draw: the reference that every backend's Backend::sample_rows follows, and the core of the
// engine's host sampler.
#pragma once

#include "dsinfer/engine_types.h"

namespace dsinfer {

// One row's sampling parameters (SamplingParams' meaning) and its uniform draw in [0, 1).
struct RowSampling {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // 0 disables; 1 is greedy
  float top_p = 1.0f;        // 1 disables
  float min_p = 0.0f;        // 0 disables
  double uniform = 0.0;      // unused by greedy rows
};

inline bool is_greedy(const RowSampling& row) { return row.temperature <= 0.0f || row.top_k == 1; }

// Greedy rows take the largest logit (the lowest id on ties). The others: candidates sorted by
// logit (descending, ties by id), cut to top_k, turned into probabilities at the temperature,
// cut by min_p (relative to the best) and then to the shortest prefix reaching top_p, and the
// token where the cumulative probability first exceeds uniform × the kept mass is chosen.
TokenId choose_token(const float* logits, int vocab, const RowSampling& row);

}  // namespace dsinfer
