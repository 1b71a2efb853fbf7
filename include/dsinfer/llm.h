// The offline engine: a batch of requests in, their completions out. What `dsinfer generate`
// uses; continuous batching inside, so mixed lengths share steps.
#pragma once

#include <memory>
#include <vector>

#include "dsinfer/engine_types.h"
#include "engine/engine_config.h"

namespace dsinfer {

class EngineCore;

struct Completion {
  std::vector<TokenId> prompt_ids;
  std::vector<TokenId> token_ids;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  PromptCacheStats prompt_cache;
  Status status;  // not ok when the request was rejected (bad parameters, too long)
};

class LLM {
 public:
  // Loads the model; throws dsinfer::Error with a message naming the file on failure.
  explicit LLM(const EngineConfig& config);
  ~LLM();

  // Runs every request to completion; results in input order.
  std::vector<Completion> generate(const std::vector<GenerationRequest>& requests);

  EngineCore& engine() { return *engine_; }

 private:
  std::unique_ptr<EngineCore> engine_;
  RequestId next_id_ = 1;
};

}  // namespace dsinfer
