// AsyncEngine: the engine core on its own thread, behind the EngineClient interface. Front ends
// submit and cancel from any thread; outputs are delivered on the engine thread through each
// request's callback. Submissions and cancellations are applied between steps, so a cancelled
// request's blocks return to the pool within one step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "dsinfer/engine_client.h"
#include "engine/engine_core.h"

namespace dsinfer {

class AsyncEngine final : public EngineClient {
 public:
  explicit AsyncEngine(const EngineConfig& config);  // loads the model; throws Error
  ~AsyncEngine() override;

  Result<RequestId> submit(GenerationRequest request, OutputCallback on_output) override;
  void cancel(RequestId id) override;
  EngineStats stats() const override;
  int max_context_tokens() const override { return max_context_tokens_; }
  std::string metrics_text() const override;
  Status health() const override;

  // Stops taking requests (submit answers kUnavailable); running ones continue.
  void stop_accepting();
  // Cancels everything still running and joins the engine thread.
  void shutdown();
  int num_unfinished() const { return num_unfinished_.load(); }
  const ModelConfig& model_config() const { return core_->model_config(); }

 private:
  struct Pending {
    RequestId id;
    GenerationRequest request;
    OutputCallback callback;
  };
  void loop();
  // The loop's body: one round of submissions, cancellations and a step. True once stopping
  // (every request cancelled): the loop ends.
  bool run_once();
  // Past an unexpected exception from the engine core (a bug: its state is unknown), every
  // request still running ends with `error`, and new ones are refused with it.
  void fail_everything(const Status& error);

  std::unique_ptr<EngineCore> core_;
  int max_context_tokens_ = 0;
  int max_queued_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> inbox_;
  std::vector<RequestId> cancels_;
  bool stopping_ = false;
  bool accepting_ = true;
  Status failure_;  // set once the engine has failed
  RequestId next_id_ = 1;
  EngineStats stats_;  // refreshed by the engine thread after each step
  kv::KvCacheMetrics kv_metrics_;  // likewise
  std::unordered_map<RequestId, OutputCallback> callbacks_;  // engine thread only
  std::atomic<int> num_unfinished_{0};
  std::thread thread_;
};

}  // namespace dsinfer
