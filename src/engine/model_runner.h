// The model runner: turns a SchedulerOutput into one forward pass (ForwardBatch), runs the
// model over the paged caches, and samples the requests that reached the end of their tokens.
#pragma once

#include <vector>

#include "engine/scheduler.h"
#include "kv/kv_cache_manager.h"
#include "model/deepseek_model.h"

namespace dsinfer {

struct SampledToken {
  Request* request = nullptr;
  TokenId token = 0;
  TokenLogprob logprob;  // filled when the request asked for logprobs
};

// A step whose forward and token choice are enqueued; collect() waits for its tokens.
struct LaunchedStep {
  SchedulerOutput sched;
  int64_t number = 0;          // steps are numbered from 1 in launch order
  uint64_t choice = 0;         // the backend's ticket; 0 when nothing samples
  std::vector<int> computed;   // per scheduled request: its num_computed_tokens after the step
  // The sampled rows' logits, copied at launch when some request asks for logprobs (a later
  // step may reuse the device buffer, e.g. a replayed recording).
  std::vector<float> logits_host;
};

class ModelRunner {
 public:
  ModelRunner(DeepseekModel& model, kv::KvCacheManager& kv, int num_blocks, int block_size,
              KvCacheFormat cache_format = KvCacheFormat::kF32);

  // Enqueues the step: every request that samples gets a pending token (its row of this step's
  // choice), and the inputs that are pending tokens of the step before are placeholders the
  // backend resolves from that step's choice. Returns before the tokens are known. Where it
  // throws (the device out of memory), no request of the step has changed.
  LaunchedStep submit(SchedulerOutput sched);
  // The step's tokens, in the order of its sampling rows (waits for them).
  std::vector<SampledToken> collect(LaunchedStep& step);
  ForwardBatch build_batch(const SchedulerOutput& out, int64_t step_number) const;
  KvCaches& caches() { return caches_; }

 private:
  DeepseekModel& model_;
  kv::KvCacheManager& kv_;
  KvCaches caches_;
  std::vector<RowSampling> row_sampling_;  // per sampled row of the step
  std::vector<LogitPenalty> penalties_;    // the step's penalised logits
  int64_t num_launched_ = 0;
};

}  // namespace dsinfer
