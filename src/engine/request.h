// A request's state inside the engine. The scheduler advances num_computed_tokens toward
// num_tokens(); that one rule covers chunked prefill, prefix hits, decoding and recompute
// after preemption.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "dsinfer/engine_types.h"
#include "engine/sampler.h"

namespace dsinfer {

enum class RequestStatus { kWaiting, kRunning, kFinished };

struct Request {
  RequestId id = 0;
  uint64_t arrival_index = 0;  // lower = older = higher priority
  std::vector<TokenId> tokens;  // prompt followed by the generated tokens
  int num_prompt_tokens = 0;
  int max_num_tokens = 0;  // prompt + max_tokens, within the model's length: no token is run past it
  SamplingParams sampling;
  std::string cache_salt;
  std::string traffic_class;
  RequestStatus status = RequestStatus::kWaiting;
  int num_computed_tokens = 0;  // tokens whose KV is in the cache
  PromptCacheStats prompt_cache;
  SamplerState sampler_state;
  FinishReason finish_reason = FinishReason::kNone;
  int num_emitted_tokens = 0;  // generated tokens already handed out in outputs
  std::vector<TokenLogprob> pending_logprobs;
  // Penalised sampling (SamplingParams::penalised): how often each token occurs in the output so
  // far, and the prompt's distinct tokens, sorted (repetition penalty only).
  std::unordered_map<TokenId, int> output_token_counts;
  std::vector<TokenId> distinct_prompt_tokens;
  // Asynchronous scheduling: tokens sampled by steps still in flight, oldest first, each as the
  // step's number and its row in that step's choice. They follow `tokens` and count for the
  // scheduler (a pending token is the next step's input), not for outputs or stop checks.
  struct PendingToken {
    int64_t step = 0;
    int row = 0;
  };
  std::deque<PendingToken> pending;

  // Every token the scheduler may run: known and pending.
  int num_tokens() const { return static_cast<int>(tokens.size() + pending.size()); }
  // Generated tokens known so far.
  int num_generated_tokens() const { return static_cast<int>(tokens.size()) - num_prompt_tokens; }
};

}  // namespace dsinfer
