// Which token a row of logits yields under a request's sampling parameters, given one uniform
// draw: the reference that every backend's Backend::sample_rows follows, and the core of the
// engine's host sampler.
#pragma once

#include "core/host_device.h"
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

// A change to one logit of one row before its token is chosen (SamplingParams' penalties, as
// the engine works them out for a token the request has seen): `repetition` first (a positive
// logit divided by it, a negative one multiplied), then `subtract`. A batch of them names each
// (row, token) once.
struct LogitPenalty {
  int32_t row = 0;
  TokenId token = 0;
  float repetition = 1.0f;
  float subtract = 0.0f;
};

DS_HOST_DEVICE inline float penalised_logit(float logit, float repetition, float subtract) {
  return (logit > 0.0f ? logit / repetition : logit * repetition) - subtract;
}

// Greedy rows take the largest logit (the lowest id on ties). The others: candidates sorted by
// logit (descending, ties by id), cut to top_k, turned into probabilities at the temperature,
// cut by min_p (relative to the best) and then to the shortest prefix reaching top_p, and the
// token where the cumulative probability first exceeds uniform × the kept mass is chosen.
TokenId choose_token(const float* logits, int vocab, const RowSampling& row);

}  // namespace dsinfer
