#include "engine/model_runner.h"

#include "core/check.h"

namespace dsinfer {

ModelRunner::ModelRunner(DeepseekModel& model, kv::KvCacheManager& kv, int num_blocks, int block_size)
    : model_(model), kv_(kv), caches_(model.allocate_caches(num_blocks, block_size)) {}

ForwardBatch ModelRunner::build_batch(const SchedulerOutput& out) const {
  ForwardBatch b;
  const int bs = caches_.block_size;
  for (size_t s = 0; s < out.scheduled.size(); ++s) {
    const ScheduledRequest& sr = out.scheduled[s];
    const Request& req = *sr.request;
    const auto& table = kv_.block_table(req.id);
    const int begin = req.num_computed_tokens, end = begin + sr.num_new_tokens;
    DS_CHECK_MSG(static_cast<int>(table.size()) * bs >= end, "request " << req.id << " lacks blocks");
    for (int pos = begin; pos < end; ++pos) {
      b.token_ids.push_back(req.tokens[pos]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(table[pos / bs] * bs + pos % bs);
      b.token_seq.push_back(static_cast<int32_t>(s));
    }
    b.block_tables.emplace_back(table.begin(), table.end());
    b.context_lens.push_back(end);
    if (sr.samples) b.logits_indices.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
  }
  b.num_tokens = static_cast<int>(b.token_ids.size());
  return b;
}

std::vector<SampledToken> ModelRunner::execute(const SchedulerOutput& out) {
  std::vector<SampledToken> sampled;
  if (out.empty()) return sampled;
  const ForwardBatch batch = build_batch(out);
  ForwardOutput fwd = model_.forward(batch, caches_);
  if (batch.logits_indices.empty()) return sampled;
  // The backend chooses every row's token where the logits are (each request's draw taken
  // from its own stream here); only the ids cross to the host, and the logits too when some
  // request asks for logprobs.
  row_sampling_.clear();
  bool all_greedy = true, want_logprobs = false;
  for (const ScheduledRequest& sr : out.scheduled) {
    if (!sr.samples) continue;
    row_sampling_.push_back(row_sampling(sr.request->sampling, sr.request->sampler_state));
    all_greedy = all_greedy && is_greedy(row_sampling_.back());
    want_logprobs = want_logprobs || sr.request->sampling.num_logprobs > 0;
  }
  if (all_greedy)
    model_.backend().argmax_rows(fwd.logits, chosen_ids_);
  else
    model_.backend().sample_rows(fwd.logits, row_sampling_, chosen_ids_);
  const int vocab = model_.config().vocab_size;
  if (want_logprobs) {
    logits_host_.resize(batch.logits_indices.size() * static_cast<size_t>(vocab));
    model_.backend().to_host(fwd.logits, logits_host_.data());
  }
  size_t row = 0;
  for (const ScheduledRequest& sr : out.scheduled) {
    if (!sr.samples) continue;
    SampledToken st{sr.request, chosen_ids_[row], {}};
    const int num_top = sr.request->sampling.num_logprobs;
    if (num_top > 0) token_logprobs(logits_host_.data() + row * vocab, vocab, st.token, num_top, &st.logprob);
    sampled.push_back(std::move(st));
    ++row;
  }
  return sampled;
}

}  // namespace dsinfer
