// The scheduler: policy only. Each step it hands out a token budget — running requests first
// (decodes and unfinished prefill chunks), then waiting ones — and asks the KV cache manager
// (mechanism) for blocks. Out of blocks: the youngest running request is preempted and will be
// recomputed later. SchedulerOutput is the one struct that crosses to the model runner.
#pragma once

#include <deque>
#include <vector>

#include "engine/request.h"
#include "kv/kv_cache_manager.h"

namespace dsinfer {

struct SchedulerConfig {
  int max_num_batched_tokens = 2048;  // token budget per step
  int max_num_seqs = 256;             // running requests at once
  bool enable_prefix_caching = true;
};

struct ScheduledRequest {
  Request* request = nullptr;
  int num_new_tokens = 0;  // tokens [num_computed_tokens, num_computed_tokens + n) run this step
  bool samples = false;    // this step reaches the end of its tokens: a new token is sampled
};

struct SchedulerOutput {
  std::vector<ScheduledRequest> scheduled;  // in batch order
  int num_scheduled_tokens = 0;
  std::vector<RequestId> preempted;
  bool empty() const { return scheduled.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, kv::KvCacheManager& kv);

  void add(Request* request);         // joins the waiting queue
  void remove(Request* request);      // finished or cancelled: frees its blocks
  SchedulerOutput schedule();
  // After a step is launched: advance num_computed_tokens. Once every token before computed[i]
  // of its i-th scheduled request is known (at once, or a step later when the engine schedules
  // ahead): register its full blocks for reuse (requests that finished or were preempted since
  // are skipped).
  void advance(const SchedulerOutput& out);
  void register_full_blocks(const SchedulerOutput& out, const std::vector<int>& computed);

  // Whether the next step would run more than one token of some request: the prompt of a
  // waiting request that may be admitted (fewer than max_num_seqs running), a prefill chunk
  // still to come, or tokens to recompute after a preemption.
  bool has_prefill_work() const;
  // Whether a running request's sampling is penalised (its penalties need its latest token).
  bool has_penalised_requests() const;
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  int max_num_batched_tokens() const { return config_.max_num_batched_tokens; }
  // Steps take at most n tokens from now on (the engine lowers it after a step ran out of
  // device memory).
  void set_max_num_batched_tokens(int n) { config_.max_num_batched_tokens = n; }

 private:
  void preempt(Request* victim);

  SchedulerConfig config_;
  kv::KvCacheManager& kv_;
  std::deque<Request*> waiting_;   // arrival order (preempted requests go back to the front)
  std::vector<Request*> running_;  // admission order
  int64_t num_preemptions_ = 0;
};

}  // namespace dsinfer
