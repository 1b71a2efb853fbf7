#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace dsinfer {
namespace {
// How long an idle engine waits for a request's block-store reads before computing instead.
constexpr int kPrefetchWaitMs = 2000;
}  // namespace

Scheduler::Scheduler(SchedulerConfig config, kv::KvCacheManager& kv) : config_(config), kv_(kv) {}

void Scheduler::add(Request* request) {
  request->status = RequestStatus::kWaiting;
  waiting_.push_back(request);
}

void Scheduler::remove(Request* request) {
  auto it = std::find(running_.begin(), running_.end(), request);
  if (it != running_.end()) running_.erase(it);
  auto wit = std::find(waiting_.begin(), waiting_.end(), request);
  if (wit != waiting_.end()) waiting_.erase(wit);
  kv_.free(request->id);
}

void Scheduler::preempt(Request* victim) {
  kv_.free(victim->id);
  victim->num_computed_tokens = 0;
  victim->status = RequestStatus::kWaiting;
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  // Back to the front, keeping arrival order among preempted requests.
  auto pos = std::find_if(waiting_.begin(), waiting_.end(),
                          [&](Request* r) { return r->arrival_index > victim->arrival_index; });
  waiting_.insert(pos, victim);
  ++num_preemptions_;
}

bool Scheduler::has_prefill_work() const {
  // A waiting request counts while a running request's place is free for it.
  if (!waiting_.empty() && static_cast<int>(running_.size()) < config_.max_num_seqs) return true;
  return std::any_of(running_.begin(), running_.end(), [](const Request* r) {
    return static_cast<int>(r->tokens.size()) - r->num_computed_tokens > 1;
  });
}

bool Scheduler::has_penalised_requests() const {
  return std::any_of(running_.begin(), running_.end(), [](const Request* r) { return r->sampling.penalised(); });
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int budget = config_.max_num_batched_tokens;

  // 1. Running requests, oldest first; the youngest is preempted when blocks run out.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* req = running_[i];
    int n = std::min(req->num_tokens() - req->num_computed_tokens, budget);
    // A last token still being sampled is never an input: the request ends with it.
    if (!req->pending.empty() && req->num_tokens() >= req->max_num_tokens) n = 0;
    if (n <= 0) {
      ++i;
      continue;
    }
    bool allocated = false;
    while (!(allocated = kv_.allocate_slots(req->id, req->num_computed_tokens + n))) {
      Request* victim = running_.back();
      out.preempted.push_back(victim->id);
      preempt(victim);
      if (victim == req) break;
    }
    if (!allocated) break;  // req itself was the youngest and is gone; nothing younger remains
    out.scheduled.push_back({req, n, req->num_computed_tokens + n == req->num_tokens()});
    budget -= n;
    ++i;
  }

  // 2. Waiting requests in order, while the budget, the sequence cap and the pool allow.
  if (out.preempted.empty()) {
    while (!waiting_.empty() && budget > 0 && static_cast<int>(running_.size()) < config_.max_num_seqs) {
      Request* req = waiting_.front();
      kv::ComputedPrefix prefix;
      if (config_.enable_prefix_caching && req->num_computed_tokens == 0) {
        // Its block-store reads are in flight: wait for them in a later step while others run,
        // or here when there is nothing else to do.
        if (!kv_.prefetch_ready(req->id)) {
          if (!running_.empty() || !out.scheduled.empty()) break;
          kv_.wait_for_prefetch(req->id, kPrefetchWaitMs);
        }
        prefix = kv_.get_computed_blocks(req->tokens, req->cache_salt);
      }
      const int num_computed = prefix.num_tokens;
      const int n = std::min(req->num_tokens() - num_computed, budget);
      if (!kv_.allocate_slots(req->id, num_computed + n, prefix)) break;  // wait for blocks
      waiting_.pop_front();
      if (req->prompt_cache.num_prompt_tokens == 0) {  // first admission: account the prefix hit
        // The cached prefix never covers the whole prompt, so the tiers' counts are prompt tokens.
        req->prompt_cache = prefix.stats;
        req->prompt_cache.num_prompt_tokens = req->num_prompt_tokens;
      }
      req->num_computed_tokens = num_computed;
      req->status = RequestStatus::kRunning;
      running_.push_back(req);
      out.scheduled.push_back({req, n, num_computed + n == req->num_tokens()});
      budget -= n;
    }
  }
  for (const auto& s : out.scheduled) out.num_scheduled_tokens += s.num_new_tokens;
  return out;
}

void Scheduler::advance(const SchedulerOutput& out) {
  for (const auto& s : out.scheduled) {
    Request* req = s.request;
    req->num_computed_tokens += s.num_new_tokens;
    DS_CHECK(req->num_computed_tokens <= req->num_tokens());
  }
}

void Scheduler::register_full_blocks(const SchedulerOutput& out, const std::vector<int>& computed) {
  if (!config_.enable_prefix_caching) return;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    Request* req = out.scheduled[i].request;
    if (req->status != RequestStatus::kRunning || req->num_computed_tokens < computed[i]) continue;
    DS_CHECK(computed[i] <= static_cast<int>(req->tokens.size()));
    kv_.cache_full_blocks(req->id, req->tokens, computed[i], req->cache_salt, req->traffic_class);
  }
}

}  // namespace dsinfer
