// The engine as seen by a front end (HTTP server, router): submit a request, receive its
// outputs as they are produced, cancel it. Implemented by the engine core's AsyncEngine.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "dsinfer/engine_types.h"

namespace dsinfer {

class EngineClient {
 public:
  // Called on the engine thread for every increment and once with finished() == true.
  // It must not block: hand the output to another thread or an I/O strand.
  using OutputCallback = std::function<void(const RequestOutput&)>;

  virtual ~EngineClient() = default;

  // Returns the new request's id, or an error (bad parameters, queue full: kResourceExhausted,
  // shutting down: kUnavailable). The callback is never called for a rejected request.
  virtual Result<RequestId> submit(GenerationRequest request, OutputCallback on_output) = 0;

  // Cancels a request; its KV blocks return to the pool within one engine step and its
  // callback receives a final output with FinishReason::kCancelled. Unknown ids are ignored.
  virtual void cancel(RequestId id) = 0;

  virtual EngineStats stats() const = 0;
  virtual int max_context_tokens() const = 0;  // prompt + output must fit
  // Engine-side Prometheus text for /metrics (KV cache tiers); empty when there is none.
  virtual std::string metrics_text() const { return {}; }
  // Ok while the engine serves; once it has failed (it then refuses every request), the error.
  virtual Status health() const { return Status(); }
};

}  // namespace dsinfer
