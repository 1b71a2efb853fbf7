// Public request/response types of the dsinfer engine, shared by the offline API, the HTTP
// server and the router. Token ids are int32; one request produces one sequence.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace dsinfer {

using TokenId = int32_t;
using RequestId = uint64_t;

struct SamplingParams {
  float temperature = 1.0f;  // 0 means greedy
  float top_p = 1.0f;        // 1 disables
  int top_k = 0;             // 0 disables
  float min_p = 0.0f;        // 0 disables
  std::optional<uint64_t> seed;  // per-request stream; unset draws from the engine's seed
  int max_tokens = 16;
  bool ignore_eos = false;
  std::vector<TokenId> stop_token_ids;  // in addition to the model's eos unless ignore_eos
  // Each generated token's log-probability under the model's distribution (the logits before
  // temperature and truncation), with its num_logprobs most likely alternatives. num_logprobs
  // above 0 implies logprobs.
  bool logprobs = false;
  int num_logprobs = 0;
  // Penalties on tokens already seen, applied to the logits before the choice (greedy too):
  // OpenAI's presence (once per token the output holds) and frequency (per occurrence in the
  // output), each subtracted; vLLM's repetition over the prompt and the output (a positive
  // logit divided by it, a negative one multiplied; 1 disables).
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  // Added to the named tokens' logits before the choice, after the penalties (OpenAI's
  // logit_bias: -100 bans a token in practice); each token once.
  std::vector<std::pair<TokenId, float>> logit_bias;
  bool wants_logprobs() const { return logprobs || num_logprobs > 0; }
  // Penalties depend on the tokens seen so far; a bias does not.
  bool penalised() const { return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f; }
  bool changes_logits() const { return penalised() || !logit_bias.empty(); }
};

struct GenerationRequest {
  std::vector<TokenId> prompt_ids;
  SamplingParams sampling;
  std::string cache_salt;     // isolates prefix-cache entries (e.g. per tenant)
  std::string traffic_class;  // KV store retention class: "chat" (default) or "agent"
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "cancelled", "error"

struct TokenLogprob {
  TokenId token_id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<TokenId, float>> top;  // num_logprobs alternatives, best first
};

// Where the prompt's tokens came from. cached = device + host + store.
struct PromptCacheStats {
  int num_prompt_tokens = 0;
  int num_device_hit_tokens = 0;
  int num_host_hit_tokens = 0;
  int num_store_hit_tokens = 0;
  int num_cached_tokens() const { return num_device_hit_tokens + num_host_hit_tokens + num_store_hit_tokens; }
};

// A streamed increment: the tokens produced since the last output for this request.
struct RequestOutput {
  RequestId request_id = 0;
  std::vector<TokenId> new_token_ids;
  std::vector<TokenLogprob> logprobs;  // one per new token when requested
  FinishReason finish_reason = FinishReason::kNone;  // kNone while running
  int num_generated_tokens = 0;  // total so far
  PromptCacheStats prompt_cache;
  Status error;  // set with kError
  bool finished() const { return finish_reason != FinishReason::kNone; }
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  int num_kv_blocks_used = 0;
  int num_kv_blocks_total = 0;
  int64_t num_steps = 0;
  int64_t num_preemptions = 0;
  int64_t num_replayed_steps = 0;  // decode steps replayed from recordings (CUDA graphs)
  int64_t num_failed_steps = 0;  // launches that threw (see EngineCore::launch)
  int step_token_budget = 0;     // tokens a step may take now (lowered after a step out of memory)
};

}  // namespace dsinfer
