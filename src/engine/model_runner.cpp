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
  // Greedy requests without logprobs need one id per row: the backend picks it where the
  // logits are, and only the ids cross to the host.
  bool all_greedy = true;
  for (const ScheduledRequest& sr : out.scheduled) {
    if (!sr.samples) continue;
    const SamplingParams& p = sr.request->sampling;
    if (!(p.temperature <= 0.0f || p.top_k == 1) || p.num_logprobs > 0) all_greedy = false;
  }
  if (all_greedy) {
    model_.backend().argmax_rows(fwd.logits, greedy_ids_);
    size_t row = 0;
    for (const ScheduledRequest& sr : out.scheduled) {
      if (!sr.samples) continue;
      sampled.push_back(SampledToken{sr.request, greedy_ids_[row++], {}});
    }
    return sampled;
  }
  const int vocab = model_.config().vocab_size;
  logits_host_.resize(batch.logits_indices.size() * static_cast<size_t>(vocab));
  model_.backend().to_host(fwd.logits, logits_host_.data());
  size_t row = 0;
  for (const ScheduledRequest& sr : out.scheduled) {
    if (!sr.samples) continue;
    Request& req = *sr.request;
    SampledToken st;
    st.request = &req;
    const bool want_logprobs = req.sampling.num_logprobs > 0;
    st.token = sample_token(logits_host_.data() + row * vocab, vocab, req.sampling, req.sampler_state,
                            want_logprobs ? &st.logprob : nullptr);
    sampled.push_back(std::move(st));
    ++row;
  }
  return sampled;
}

}  // namespace dsinfer
