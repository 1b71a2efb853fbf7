#include "dsinfer/llm.h"

#include <unordered_map>

#include "engine/engine_core.h"

namespace dsinfer {

LLM::LLM(const EngineConfig& config) : engine_(std::make_unique<EngineCore>(config)) {}
LLM::~LLM() = default;

std::vector<Completion> LLM::generate(const std::vector<GenerationRequest>& requests) {
  std::vector<Completion> results(requests.size());
  std::unordered_map<RequestId, size_t> index_of;
  for (size_t i = 0; i < requests.size(); ++i) {
    results[i].prompt_ids = requests[i].prompt_ids;
    const RequestId id = next_id_++;
    Status st = engine_->add_request(id, requests[i]);
    if (!st.ok()) {
      results[i].status = st;
      results[i].finish_reason = FinishReason::kError;
      continue;
    }
    index_of[id] = i;
  }
  while (engine_->has_unfinished_requests()) {
    for (RequestOutput& out : engine_->step()) {
      Completion& c = results[index_of.at(out.request_id)];
      c.token_ids.insert(c.token_ids.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      for (auto& lp : out.logprobs) c.logprobs.push_back(std::move(lp));
      c.prompt_cache = out.prompt_cache;
      if (out.finished()) {
        c.finish_reason = out.finish_reason;
        c.status = out.error;  // a failed step's error (kError); ok otherwise
      }
    }
  }
  return results;
}

}  // namespace dsinfer
