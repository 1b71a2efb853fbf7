#include "engine/engine_core.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <xxhash.h>

#include "core/check.h"
#include "core/fault_injection.h"
#include "core/logging.h"
#include "engine/kv_cache_sizing.h"
#include "model/checkpoint.h"

namespace dsinfer {
namespace {

// Prefix-cache namespace: blocks are only shared between processes serving the same weights.
// XXH3 rather than std::hash: the block store outlives the binary that wrote it.
std::string model_identity(const EngineConfig& config, const ModelConfig& model) {
  std::string text;
  if (!config.dummy_weights) {
    std::ifstream f(config.model_dir + "/config.json", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  std::ostringstream id;
  id << model.architecture << "/" << std::hex << XXH3_64bits(text.data(), text.size()) << "/seed" << config.seed
     << (config.dummy_weights ? "/dummy" : "") << (config.dummy_weights && config.dummy_fp8 ? "-fp8" : "")
     << (config.kv_cache_format == KvCacheFormat::kF32 ? "" : "/kv-fp8");
  return id.str();
}

// Each biased token inside the vocabulary, once, by a finite bias in [-100, 100].
Status check_logit_bias(const std::vector<std::pair<TokenId, float>>& bias, int vocab) {
  std::vector<TokenId> tokens;
  for (const auto& [token, value] : bias) {
    if (token < 0 || token >= vocab)
      return invalid_argument("logit_bias names token " + std::to_string(token) + ", outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
    if (!(value >= -100.0f && value <= 100.0f))
      return invalid_argument("logit_bias values must be in [-100, 100]");
    tokens.push_back(token);
  }
  std::sort(tokens.begin(), tokens.end());
  if (std::adjacent_find(tokens.begin(), tokens.end()) != tokens.end())
    return invalid_argument("logit_bias names a token twice");
  return Status();
}

}  // namespace

Status check_context_length(size_t num_prompt_tokens, int max_tokens, int max_model_len) {
  if (static_cast<int64_t>(num_prompt_tokens) + max_tokens <= max_model_len) return Status();
  return Status(StatusCode::kOutOfRange, "this model's maximum context length is " + std::to_string(max_model_len) +
                                             " tokens; the request has " + std::to_string(num_prompt_tokens) +
                                             " prompt tokens and asks for " + std::to_string(max_tokens) + " more");
}

EngineCore::EngineCore(const EngineConfig& config) : config_(config) {
  backend_ = make_backend(config_.backend, config_.precision);
  ModelConfig mc = ModelConfig::load(config_.model_dir);
  max_model_len_ = config_.max_model_len > 0 ? std::min(config_.max_model_len, mc.max_position_embeddings)
                                             : mc.max_position_embeddings;
  if (config_.dummy_weights) {
    ModelWeights w = make_random_weights(mc, *backend_, config_.seed + 1, config_.dummy_fp8);
    model_ = std::make_unique<DeepseekModel>(mc, std::move(w), *backend_, max_model_len_);
  } else {
    model_ = load_deepseek_model(config_.model_dir, *backend_, max_model_len_, config_.print_load_progress);
  }
  eos_ids_ = model_->config().eos_token_ids;

  const int bs = config_.block_size_tokens;
  int num_blocks = config_.num_kv_blocks;
  if (num_blocks <= 0 && config_.device_memory_fraction > 0)
    num_blocks = kv_blocks_for_device_memory(*model_, *backend_, config_, max_model_len_).value_or(0);
  if (num_blocks <= 0) {
    const int64_t per_block = static_cast<int64_t>(model_->kv_bytes_per_token(config_.kv_cache_format)) * bs;
    num_blocks = static_cast<int>(std::min<int64_t>(config_.kv_cache_bytes / per_block, 1 << 20));
  }
  const int min_blocks = (max_model_len_ + bs - 1) / bs;
  if (num_blocks < min_blocks) {
    DS_LOG_WARN("KV cache of " << num_blocks << " blocks cannot hold one full-length request; using " << min_blocks);
    num_blocks = min_blocks;
  }
  kv::KvCacheConfig kv_config;
  kv_config.num_device_blocks = num_blocks;
  kv_config.block_size_tokens = bs;
  kv_config.enable_prefix_caching = config_.enable_prefix_caching;
  kv_config.model_identity = model_identity(config_, model_->config());
  const kv::KvTierOptions& tiers = config_.kv_tiers;
  if (config_.enable_prefix_caching && (tiers.host_cache_bytes > 0 || tiers.store_enabled)) {
    kv_block_io_ = std::make_unique<KvCachesBlockIo>(*backend_, model_->config(), config_.kv_cache_format, bs);
    kv_config.block_io = kv_block_io_.get();
    kv_config.host_cache_bytes = tiers.host_cache_bytes;
    kv_config.store = kv::open_block_store(tiers);
    kv_config.store_unit_tokens = tiers.store_unit_tokens;
    if (kv_config.store) DS_LOG_INFO("engine: KV block store at " << kv_config.store->config().directory);
  }
  kv_ = std::make_unique<kv::KvCacheManager>(std::move(kv_config));
  scheduler_ = std::make_unique<Scheduler>(
      SchedulerConfig{config_.max_num_batched_tokens, config_.max_num_seqs, config_.enable_prefix_caching}, *kv_);
  runner_ = std::make_unique<ModelRunner>(*model_, *kv_, num_blocks, bs, config_.kv_cache_format);
  if (kv_block_io_) kv_block_io_->attach(&runner_->caches());
  DS_LOG_INFO("engine: " << model_->config().architecture << ", backend " << backend_->name() << ", "
                         << num_blocks << " KV blocks of " << bs << " tokens ("
                         << kv_cache_format_name(config_.kv_cache_format) << "), max length " << max_model_len_);
}

EngineCore::~EngineCore() = default;

Status EngineCore::add_request(RequestId id, const GenerationRequest& r) {
  const SamplingParams& p = r.sampling;
  const int vocab = model_->config().vocab_size;
  if (requests_.count(id)) return invalid_argument("duplicate request id " + std::to_string(id));
  if (r.prompt_ids.empty()) return invalid_argument("the prompt is empty");
  for (TokenId t : r.prompt_ids)
    if (t < 0 || t >= vocab)
      return invalid_argument("prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
  if (p.max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
  if (!(p.temperature >= 0.0f) || p.temperature > 100.0f) return invalid_argument("temperature must be in [0, 100]");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return invalid_argument("top_p must be in (0, 1]");
  if (p.top_k < 0) return invalid_argument("top_k must be >= 0");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return invalid_argument("min_p must be in [0, 1]");
  if (p.num_logprobs < 0 || p.num_logprobs > 20) return invalid_argument("logprobs must be in [0, 20]");
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    return invalid_argument("presence_penalty must be in [-2, 2]");
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    return invalid_argument("frequency_penalty must be in [-2, 2]");
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty <= 2.0f))
    return invalid_argument("repetition_penalty must be in (0, 2]");
  if (Status st = check_logit_bias(p.logit_bias, vocab); !st.ok()) return st;
  if (Status st = check_context_length(r.prompt_ids.size(), p.max_tokens, max_model_len_); !st.ok()) return st;
  if (scheduler_->num_waiting() >= config_.max_queued_requests)
    return Status(StatusCode::kResourceExhausted, "the request queue is full");

  auto req = std::make_unique<Request>();
  req->id = id;
  req->arrival_index = next_arrival_++;
  req->tokens = r.prompt_ids;
  req->num_prompt_tokens = static_cast<int>(r.prompt_ids.size());
  req->max_num_tokens = req->num_prompt_tokens + p.max_tokens;
  req->sampling = p;
  req->cache_salt = r.cache_salt;
  req->traffic_class = r.traffic_class;
  if (p.repetition_penalty != 1.0f) {
    std::vector<TokenId>& distinct = req->distinct_prompt_tokens;
    distinct = r.prompt_ids;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  }
  // Each request draws from its own stream: its samples never depend on the batch.
  req->sampler_state = SamplerState(p.seed ? *p.seed : (config_.seed * 0x9e3779b97f4a7c15ull) ^ (id + 1));
  scheduler_->add(req.get());
  // Store reads start now, before the request's prefill is scheduled.
  kv_->prefetch(id, req->tokens, req->cache_salt);
  requests_.emplace(id, std::move(req));
  return Status();
}

RequestOutput EngineCore::make_output(Request& req) {
  RequestOutput out;
  out.request_id = req.id;
  const int generated = req.num_generated_tokens();
  out.new_token_ids.assign(req.tokens.begin() + req.num_prompt_tokens + req.num_emitted_tokens, req.tokens.end());
  out.logprobs = std::move(req.pending_logprobs);
  req.pending_logprobs.clear();
  req.num_emitted_tokens = generated;
  out.num_generated_tokens = generated;
  out.finish_reason = req.finish_reason;
  out.prompt_cache = req.prompt_cache;
  out.prompt_cache.num_prompt_tokens = req.num_prompt_tokens;
  return out;
}

std::optional<RequestOutput> EngineCore::abort_request(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return std::nullopt;
  Request& req = *it->second;
  req.finish_reason = FinishReason::kCancelled;
  RequestOutput out = make_output(req);
  retire(id);
  return out;
}

void EngineCore::retire(RequestId id) {
  auto it = requests_.find(id);
  DS_CHECK(it != requests_.end());
  it->second->status = RequestStatus::kFinished;
  scheduler_->remove(it->second.get());
  retired_now_.push_back(std::move(it->second));
  requests_.erase(it);
}

bool EngineCore::check_stop(Request& req, TokenId token) const {
  const SamplingParams& p = req.sampling;
  if (!p.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) {
    req.finish_reason = FinishReason::kStop;
  } else if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end()) {
    req.finish_reason = FinishReason::kStop;
  } else if (req.num_generated_tokens() >= p.max_tokens || static_cast<int>(req.tokens.size()) >= max_model_len_) {
    req.finish_reason = FinishReason::kLength;
  }
  return req.finish_reason != FinishReason::kNone;
}

// One step: schedule and launch the next forward, then finish the step before it (with
// asynchronous scheduling, the one launched by the previous call, which the device has been
// running meanwhile; otherwise the one just launched).
//
// Asynchronous scheduling runs one step ahead only while no request has prefill work. Launched
// ahead, a step with prompt tokens held back the outputs of the step before it, first tokens
// among them, for most of its own run: on V2-Lite's 200-prompt workload the median time to
// first token grew by 13%, about one prefill step. (Such a step is a thousand or more eager
// launches on the CUDA backend, and enqueuing them seems to wait for the device once its queue
// of pending launches is full.) So the step in flight is finished and its outputs returned
// first, and a step with prefill work is finished in the call that launches it; decode-only
// steps, replayed from recordings in a few launches, still go one ahead, unless a request's
// penalties need the token that the step in flight is choosing.
std::vector<RequestOutput> EngineCore::step() {
  const bool ahead =
      config_.async_scheduling && !scheduler_->has_prefill_work() && !scheduler_->has_penalised_requests();
  std::vector<RequestOutput> outputs;
  if (!ahead && in_flight_) {
    outputs = finish_step(*in_flight_);
    in_flight_.reset();
    end_call();
    return outputs;
  }
  maybe_inject_fault("engine_step");
  std::optional<LaunchedStep> next;
  std::vector<RequestOutput> failed;
  SchedulerOutput sched = scheduler_->schedule();
  if (!sched.empty()) {
    ++num_steps_;
    next = launch(std::move(sched), failed);
  }
  if (ahead) {
    if (in_flight_) outputs = finish_step(*in_flight_);
    in_flight_ = std::move(next);
  } else if (next) {
    outputs = finish_step(*next);
  }
  outputs.insert(outputs.end(), std::make_move_iterator(failed.begin()), std::make_move_iterator(failed.end()));
  end_call();
  return outputs;
}

// A launch that throws leaves its requests as they were (ModelRunner::submit changes none of
// them before it succeeds), so the engine chooses which of them run again:
// - Out of device memory in a step with prompt tokens: the step was too large. Steps take at
//   most half its tokens from now on, and every request of the step runs again (prompts in
//   smaller chunks). Below kMinStepTokens, the requests that brought prompt tokens end with the
//   error instead.
// - Otherwise the requests that brought prompt tokens end with the error, and decoding ones
//   run again; a step of decoding requests alone ends them all, so that a failing step is not
//   retried forever.
// Ended requests' blocks go back to the pool. A step in flight before the failed one finishes as
// usual, skipping the ended requests' rows.
std::optional<LaunchedStep> EngineCore::launch(SchedulerOutput sched, std::vector<RequestOutput>& failed) {
  std::vector<RequestId> with_prompt, decoding;
  for (const ScheduledRequest& sr : sched.scheduled) {
    const Request& req = *sr.request;
    const bool prompt = sr.num_new_tokens > 1 || req.num_computed_tokens < req.num_prompt_tokens;
    (prompt ? with_prompt : decoding).push_back(req.id);
  }
  const int num_step_tokens = sched.num_scheduled_tokens;
  Status error;
  try {
    LaunchedStep step = runner_->submit(std::move(sched));
    scheduler_->advance(step.sched);
    return step;
  } catch (const Error& e) {
    error = e.status();
  } catch (const std::bad_alloc&) {
    error = Status(StatusCode::kResourceExhausted, "out of host memory");
  } catch (const std::exception& e) {
    error = internal_error(e.what());
  }
  ++num_failed_steps_;
  const int smaller_budget = std::min(scheduler_->max_num_batched_tokens(), num_step_tokens) / 2;
  if (error.code() == StatusCode::kResourceExhausted && !with_prompt.empty() && smaller_budget >= kMinStepTokens) {
    scheduler_->set_max_num_batched_tokens(smaller_budget);
    DS_LOG_WARN("engine: a step of " << num_step_tokens << " tokens ran out of memory (" << error.message()
                                     << "); steps now take at most " << smaller_budget << " tokens");
    return std::nullopt;
  }
  const std::vector<RequestId>& ended = with_prompt.empty() ? decoding : with_prompt;
  DS_LOG_ERROR("engine: a step of " << with_prompt.size() + decoding.size() << " request(s) failed (" << error.message()
                                    << "); " << ended.size() << " of them end with the error, the rest run again");
  for (RequestId id : ended) {
    Request& req = *requests_.at(id);
    req.finish_reason = FinishReason::kError;
    RequestOutput out = make_output(req);
    out.error = Status(error.code(), "the engine could not run a step with this request: " + error.message());
    failed.push_back(std::move(out));
    retire(id);
  }
  return std::nullopt;
}

void EngineCore::end_call() {
  // Requests retired before this call's finish are in no launched step any more.
  retired_before_ = std::move(retired_now_);
  retired_now_.clear();
}

std::vector<RequestOutput> EngineCore::finish_step(LaunchedStep& step) {
  std::vector<SampledToken> sampled = runner_->collect(step);
  // The step's inputs are all known now: its full blocks may be reused.
  scheduler_->register_full_blocks(step.sched, step.computed);
  std::vector<RequestOutput> outputs;
  for (SampledToken& st : sampled) {
    Request& req = *st.request;
    DS_CHECK(!req.pending.empty() && req.pending.front().step == step.number);
    req.pending.pop_front();
    if (req.finish_reason != FinishReason::kNone) continue;  // stopped or cancelled while the step ran
    req.tokens.push_back(st.token);
    if (req.sampling.penalised()) ++req.output_token_counts[st.token];
    if (req.sampling.wants_logprobs()) req.pending_logprobs.push_back(std::move(st.logprob));
    check_stop(req, st.token);
    outputs.push_back(make_output(req));
    if (req.finish_reason != FinishReason::kNone) retire(req.id);
  }
  return outputs;
}

EngineStats EngineCore::stats() const {
  EngineStats s;
  s.num_running = scheduler_->num_running();
  s.num_waiting = scheduler_->num_waiting();
  s.num_kv_blocks_total = kv_->num_total_blocks();
  s.num_kv_blocks_used = kv_->num_used_blocks();
  s.num_steps = num_steps_;
  s.num_preemptions = scheduler_->num_preemptions();
  s.num_replayed_steps = model_->num_replayed_steps();
  s.num_failed_steps = num_failed_steps_;
  s.step_token_budget = scheduler_->max_num_batched_tokens();
  return s;
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "none";
}

}  // namespace dsinfer
