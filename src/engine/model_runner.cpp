#include "engine/model_runner.h"

#include <unordered_map>

#include "core/check.h"

namespace dsinfer {

ModelRunner::ModelRunner(DeepseekModel& model, kv::KvCacheManager& kv, int num_blocks, int block_size,
                         KvCacheFormat cache_format)
    : model_(model), kv_(kv), caches_(model.allocate_caches(num_blocks, block_size, cache_format)) {}

ForwardBatch ModelRunner::build_batch(const SchedulerOutput& out, int64_t step_number) const {
  ForwardBatch b;
  const int bs = caches_.block_size;
  for (size_t s = 0; s < out.scheduled.size(); ++s) {
    const ScheduledRequest& sr = out.scheduled[s];
    const Request& req = *sr.request;
    const auto& table = kv_.block_table(req.id);
    const int begin = req.num_computed_tokens, end = begin + sr.num_new_tokens;
    DS_CHECK_MSG(static_cast<int>(table.size()) * bs >= end, "request " << req.id << " lacks blocks");
    for (int pos = begin; pos < end; ++pos) {
      const int known = static_cast<int>(req.tokens.size());
      if (pos < known) {
        b.token_ids.push_back(req.tokens[pos]);
      } else {
        // A token the step before samples: a placeholder for its row of that step's choice.
        const Request::PendingToken& p = req.pending[pos - known];
        DS_CHECK_MSG(p.step == step_number - 1, "request " << req.id << " needs a token of step " << p.step
                                                           << " as an input of step " << step_number);
        b.token_ids.push_back(-1 - p.row);
      }
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

namespace {

// The request's penalties and bias as changes to its row's logits: each token of its output
// (presence, frequency and repetition), with a repetition penalty each other token of its
// prompt, and each biased token (its bias added after any penalty of its own).
void add_penalties(const Request& req, int32_t row, std::vector<LogitPenalty>& out) {
  const SamplingParams& p = req.sampling;
  std::unordered_map<TokenId, float> bias_left(p.logit_bias.begin(), p.logit_bias.end());
  auto add = [&](TokenId token, float repetition, float subtract) {
    if (auto b = bias_left.find(token); b != bias_left.end()) {
      subtract -= b->second;
      bias_left.erase(b);
    }
    out.push_back({row, token, repetition, subtract});
  };
  for (const auto& [token, count] : req.output_token_counts)
    add(token, p.repetition_penalty, p.presence_penalty + p.frequency_penalty * static_cast<float>(count));
  for (TokenId token : req.distinct_prompt_tokens)
    if (req.output_token_counts.count(token) == 0) add(token, p.repetition_penalty, 0.0f);
  for (const auto& [token, bias] : bias_left) out.push_back({row, token, 1.0f, -bias});
}

}  // namespace

LaunchedStep ModelRunner::submit(SchedulerOutput sched) {
  LaunchedStep step;
  step.number = num_launched_ + 1;
  step.sched = std::move(sched);
  if (step.sched.empty()) {
    num_launched_ = step.number;
    return step;
  }
  const ForwardBatch batch = build_batch(step.sched, step.number);
  ForwardOutput fwd = model_.forward(batch, caches_);
  // The backend chooses every sampled row's token where the logits are (each request's draw
  // taken from its own stream here); only the ids cross to the host, and the logits too when
  // some request asks for logprobs. The draws come from copies of the requests' streams, and
  // nothing of a request changes until the launch has succeeded: a launch that throws leaves
  // its requests as they were (EngineCore::launch may run some of them again).
  row_sampling_.clear();
  penalties_.clear();
  std::vector<SamplerState> drawn_states;
  bool want_logprobs = false;
  for (const ScheduledRequest& sr : step.sched.scheduled) {
    if (!sr.samples) continue;
    SamplerState state = sr.request->sampler_state;
    if (sr.request->sampling.changes_logits())
      add_penalties(*sr.request, static_cast<int32_t>(row_sampling_.size()), penalties_);
    row_sampling_.push_back(row_sampling(sr.request->sampling, state));
    drawn_states.push_back(state);
    want_logprobs = want_logprobs || sr.request->sampling.wants_logprobs();
  }
  // Logprobs are the model's: copied before the penalties change the logits.
  if (want_logprobs) {
    step.logits_host.resize(row_sampling_.size() * static_cast<size_t>(model_.config().vocab_size));
    model_.backend().to_host(fwd.logits, step.logits_host.data());
  }
  if (!penalties_.empty()) model_.backend().penalise_logits(fwd.logits, penalties_);
  if (!row_sampling_.empty()) step.choice = model_.backend().choose_async(fwd.logits, row_sampling_);
  size_t row = 0;
  for (const ScheduledRequest& sr : step.sched.scheduled) {
    step.computed.push_back(sr.request->num_computed_tokens + sr.num_new_tokens);
    if (!sr.samples) continue;
    sr.request->pending.push_back({step.number, static_cast<int>(row)});
    sr.request->sampler_state = drawn_states[row];
    ++row;
  }
  num_launched_ = step.number;
  return step;
}

std::vector<SampledToken> ModelRunner::collect(LaunchedStep& step) {
  std::vector<SampledToken> sampled;
  if (step.choice == 0) return sampled;
  const std::vector<int32_t> ids = model_.backend().wait_choice(step.choice);
  const int vocab = model_.config().vocab_size;
  size_t row = 0;
  for (const ScheduledRequest& sr : step.sched.scheduled) {
    if (!sr.samples) continue;
    SampledToken st{sr.request, ids[row], {}};
    const SamplingParams& sampling = sr.request->sampling;
    if (sampling.wants_logprobs())
      token_logprobs(step.logits_host.data() + row * vocab, vocab, st.token, sampling.num_logprobs, &st.logprob);
    sampled.push_back(std::move(st));
    ++row;
  }
  return sampled;
}

}  // namespace dsinfer
