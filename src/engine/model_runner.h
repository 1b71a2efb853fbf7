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

class ModelRunner {
 public:
  ModelRunner(DeepseekModel& model, kv::KvCacheManager& kv, int num_blocks, int block_size);

  std::vector<SampledToken> execute(const SchedulerOutput& out);
  ForwardBatch build_batch(const SchedulerOutput& out) const;
  KvCaches& caches() { return caches_; }

 private:
  DeepseekModel& model_;
  kv::KvCacheManager& kv_;
  KvCaches caches_;
  std::vector<float> logits_host_;
  std::vector<RowSampling> row_sampling_;  // per sampled row of the step
  std::vector<int32_t> chosen_ids_;
};

}  // namespace dsinfer
