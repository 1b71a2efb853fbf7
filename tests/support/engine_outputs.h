// A request's outputs gathered over an engine's steps, for tests that drive EngineCore directly.
#pragma once

#include <map>
#include <vector>

#include "engine/engine_core.h"

namespace dsinfer::testing {

struct FinishedRequest {
  std::vector<TokenId> tokens;
  FinishReason finish = FinishReason::kNone;
  Status error;
};

using Outputs = std::map<RequestId, FinishedRequest>;

// Adds a step's outputs: their tokens, and the finish (reason, error) of those that finished.
inline void add_outputs(Outputs& into, const std::vector<RequestOutput>& outputs) {
  for (const RequestOutput& o : outputs) {
    FinishedRequest& f = into[o.request_id];
    f.tokens.insert(f.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    if (o.finished()) {
      f.finish = o.finish_reason;
      f.error = o.error;
    }
  }
}

// Steps the engine until it has nothing left (at most max_steps) into `into`.
inline Outputs& run_to_end(EngineCore& core, Outputs& into, int max_steps = 500) {
  for (int step = 0; step < max_steps && core.has_unfinished_requests(); ++step) add_outputs(into, core.step());
  return into;
}

inline Outputs run_to_end(EngineCore& core) {
  Outputs outputs;
  return run_to_end(core, outputs);
}

}  // namespace dsinfer::testing
