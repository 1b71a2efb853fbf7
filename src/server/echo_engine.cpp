// EchoEngine: a step loop like the real engine's (admit waiting → one token for every running
// request → outputs), with none of the model.
#include "server/echo_engine.h"

#include <algorithm>
#include <chrono>
#include <limits>

namespace dsinfer::server {

EchoEngine::EchoEngine(EchoEngineOptions options) : options_(options) {
  thread_ = std::thread([this] { loop(); });
}

EchoEngine::~EchoEngine() { shutdown(); }

void EchoEngine::shutdown() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

namespace {

// The scripted token is certain (log-probability 0); the alternatives after it are the lowest
// ids, impossible (-infinity).
TokenLogprob scripted_logprob(TokenId token, int num_top) {
  TokenLogprob lp;
  lp.token_id = token;
  lp.logprob = 0.0f;
  if (num_top > 0) lp.top.emplace_back(token, 0.0f);
  for (TokenId id = 0; static_cast<int>(lp.top.size()) < num_top; ++id)
    if (id != token) lp.top.emplace_back(id, -std::numeric_limits<float>::infinity());
  return lp;
}

}  // namespace

int EchoEngine::blocks_for(int num_tokens) const {
  return (num_tokens + options_.block_size_tokens - 1) / options_.block_size_tokens;
}

Result<RequestId> EchoEngine::submit(GenerationRequest request, OutputCallback on_output) {
  if (request.prompt_ids.empty()) return Status(StatusCode::kInvalidArgument, "the prompt is empty");
  if (request.sampling.max_tokens < 1) return Status(StatusCode::kInvalidArgument, "max_tokens must be at least 1");
  if (static_cast<int64_t>(request.prompt_ids.size()) + request.sampling.max_tokens > options_.max_context_tokens) {
    return Status(StatusCode::kOutOfRange, "prompt + max_tokens exceed the context");
  }
  auto active = std::make_shared<Active>();
  const auto& p = request.prompt_ids;
  auto begin = std::find(p.rbegin(), p.rend(), options_.reply_begin_id);
  if (begin == p.rend()) {
    active->script = p;
  } else {
    auto from = begin.base();
    auto to = std::find(from, p.end(), options_.reply_end_id);
    active->script.assign(from, to);
  }
  active->max_tokens = request.sampling.max_tokens;
  active->num_prompt_tokens = static_cast<int>(p.size());
  active->ignore_eos = request.sampling.ignore_eos;
  active->logprobs = request.sampling.wants_logprobs();
  active->num_logprobs = request.sampling.num_logprobs;
  active->on_output = std::move(on_output);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return Status(StatusCode::kUnavailable, "the engine is shutting down");
    if (static_cast<int>(waiting_.size()) >= options_.max_waiting) {
      return Status(StatusCode::kResourceExhausted, "the engine's queue is full");
    }
    active->id = next_id_++;
    waiting_.push_back(active);
    by_id_[active->id] = active;
  }
  wake_.notify_all();
  return active->id;
}

void EchoEngine::cancel(RequestId id) {
  std::lock_guard lock(mutex_);
  auto it = by_id_.find(id);
  if (it != by_id_.end()) it->second->cancelled = true;
}

EngineStats EchoEngine::stats() const {
  std::lock_guard lock(mutex_);
  EngineStats s;
  s.num_running = static_cast<int>(running_.size());
  s.num_waiting = static_cast<int>(waiting_.size());
  s.num_kv_blocks_used = num_blocks_used_;
  s.num_kv_blocks_total = options_.num_kv_blocks;
  s.num_steps = num_steps_;
  return s;
}

void EchoEngine::loop() {
  std::vector<std::pair<std::shared_ptr<Active>, RequestOutput>> outputs;
  while (true) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !running_.empty(); });
      if (stopping_) {
        for (auto& [id, a] : by_id_) {
          RequestOutput out;
          out.request_id = id;
          out.finish_reason = FinishReason::kCancelled;
          outputs.push_back({a, out});
        }
        by_id_.clear();
        running_.clear();
        waiting_.clear();
        num_blocks_used_ = 0;
        lock.unlock();
        for (auto& [a, out] : outputs) a->on_output(out);
        return;
      }
      // Cancelled waiting requests leave without ever running.
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if ((*it)->cancelled) {
          RequestOutput out;
          out.request_id = (*it)->id;
          out.finish_reason = FinishReason::kCancelled;
          outputs.push_back({*it, out});
          by_id_.erase((*it)->id);
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
      while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_running) {
        auto a = waiting_.front();
        int blocks = blocks_for(a->num_prompt_tokens + 1);
        if (num_blocks_used_ + blocks > options_.num_kv_blocks) break;
        waiting_.pop_front();
        a->num_blocks = blocks;
        num_blocks_used_ += blocks;
        running_[a->id] = a;
      }
      ++num_steps_;
      for (auto it = running_.begin(); it != running_.end();) {
        auto& a = it->second;
        RequestOutput out;
        out.request_id = a->id;
        out.prompt_cache.num_prompt_tokens = a->num_prompt_tokens;
        if (a->cancelled) {
          out.finish_reason = FinishReason::kCancelled;
        } else {
          TokenId token = a->next < a->script.size() ? a->script[a->next] : (a->ignore_eos ? TokenId{' '} : options_.eos_id);
          ++a->next;
          out.new_token_ids.push_back(token);
          if (a->logprobs) out.logprobs.push_back(scripted_logprob(token, a->num_logprobs));
          out.num_generated_tokens = static_cast<int>(a->next);
          if (token == options_.eos_id && !a->ignore_eos) out.finish_reason = FinishReason::kStop;
          else if (static_cast<int>(a->next) >= a->max_tokens) out.finish_reason = FinishReason::kLength;
          int blocks = blocks_for(a->num_prompt_tokens + static_cast<int>(a->next) + 1);
          num_blocks_used_ += blocks - a->num_blocks;
          a->num_blocks = blocks;
        }
        if (out.finished()) {
          num_blocks_used_ -= a->num_blocks;
          a->num_blocks = 0;
          by_id_.erase(a->id);
        }
        outputs.push_back({a, out});
        it = out.finished() ? running_.erase(it) : std::next(it);
      }
    }
    for (auto& [a, out] : outputs) a->on_output(out);
    outputs.clear();
    if (options_.step_interval_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(options_.step_interval_us));
  }
}

}  // namespace dsinfer::server
