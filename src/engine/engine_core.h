// The engine core: requests in, token increments out. One step = schedule → run → postprocess.
// Single-threaded; AsyncEngine and the offline LLM drive it.
#pragma once

#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "dsinfer/engine_types.h"
#include "engine/engine_config.h"
#include "engine/kv_caches_block_io.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "kv/kv_cache_manager.h"
#include "model/deepseek_model.h"

namespace dsinfer {

// kOutOfRange when prompt + max_tokens does not fit max_model_len; ok otherwise.
Status check_context_length(size_t num_prompt_tokens, int max_tokens, int max_model_len);

class EngineCore {
 public:
  // Loads the model; throws Error with a clear message on a bad directory or checkpoint.
  explicit EngineCore(const EngineConfig& config);
  ~EngineCore();

  // Validates and queues a request under `id` (unique, chosen by the caller).
  Status add_request(RequestId id, const GenerationRequest& request);
  // Finishes a request as cancelled; its blocks return to the pool now. Returns its final
  // output, or nothing for an unknown id.
  std::optional<RequestOutput> abort_request(RequestId id);
  // One engine step; returns the increments of every request that produced tokens or finished.
  std::vector<RequestOutput> step();

  bool has_unfinished_requests() const { return !requests_.empty() || in_flight_.has_value(); }
  EngineStats stats() const;
  // The backend's device idle time between consecutive steps since the last call (nullopt for
  // backends that do not measure it).
  std::optional<StepGapStats> device_step_gaps() { return backend_->step_gaps(); }
  const ModelConfig& model_config() const { return model_->config(); }
  int max_model_len() const { return max_model_len_; }
  const EngineConfig& config() const { return config_; }
  kv::KvCacheManager& kv_cache() { return *kv_; }

 private:
  RequestOutput make_output(Request& req);
  bool check_stop(Request& req, TokenId token) const;
  // Steps are not made smaller than this after running out of memory (see launch).
  static constexpr int kMinStepTokens = 64;
  // Launches a scheduled step. Where that throws, either lowers the step token budget so that
  // the step's requests run again in smaller steps, or ends some of them into `failed`.
  std::optional<LaunchedStep> launch(SchedulerOutput sched, std::vector<RequestOutput>& failed);
  // Waits for a launched step's tokens and turns them into outputs.
  std::vector<RequestOutput> finish_step(LaunchedStep& step);
  // Out of the scheduler and of requests_; kept alive until no launched step refers to it.
  void retire(RequestId id);
  // The end of a call to step(): the retired requests move on one step (retired_now_ below).
  void end_call();

  EngineConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeepseekModel> model_;
  std::unique_ptr<KvCachesBlockIo> kv_block_io_;  // before kv_: the manager uses it
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;
  std::optional<LaunchedStep> in_flight_;  // asynchronous scheduling: the step launched last
  // Retired requests: since the step before (may be in the step being finished), and since now
  // (may be in the step in flight).
  std::vector<std::unique_ptr<Request>> retired_before_, retired_now_;
  std::vector<int> eos_ids_;
  int max_model_len_ = 0;
  uint64_t next_arrival_ = 0;
  int64_t num_steps_ = 0;
  int64_t num_failed_steps_ = 0;
};

}  // namespace dsinfer
