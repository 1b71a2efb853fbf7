#include "engine/async_engine.h"

#include "core/logging.h"
#include "kv/kv_metrics.h"

namespace dsinfer {

AsyncEngine::AsyncEngine(const EngineConfig& config) : core_(std::make_unique<EngineCore>(config)) {
  max_context_tokens_ = core_->max_model_len();
  max_queued_ = config.max_queued_requests;
  stats_ = core_->stats();
  kv_metrics_ = core_->kv_cache().metrics();
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() { shutdown(); }

Result<RequestId> AsyncEngine::submit(GenerationRequest request, OutputCallback on_output) {
  // Cheap checks here so that the caller gets its error at once; the engine re-validates.
  if (request.prompt_ids.empty()) return invalid_argument("the prompt is empty");
  if (Status st = check_context_length(request.prompt_ids.size(), request.sampling.max_tokens, max_context_tokens_);
      !st.ok())
    return st;
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok()) return failure_;
  if (!accepting_ || stopping_) return Status(StatusCode::kUnavailable, "the server is shutting down");
  if (static_cast<int>(inbox_.size()) + stats_.num_waiting >= max_queued_)
    return Status(StatusCode::kResourceExhausted, "the request queue is full");
  const RequestId id = next_id_++;
  inbox_.push_back({id, std::move(request), std::move(on_output)});
  ++num_unfinished_;
  cv_.notify_one();
  return id;
}

void AsyncEngine::cancel(RequestId id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
  cv_.notify_one();
}

EngineStats AsyncEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.num_waiting += static_cast<int>(inbox_.size());
  return s;
}

void AsyncEngine::stop_accepting() {
  std::lock_guard<std::mutex> lock(mu_);
  accepting_ = false;
}

void AsyncEngine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    accepting_ = false;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void AsyncEngine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !cancels_.empty() || core_->has_unfinished_requests(); });
    }
    try {
      if (run_once()) return;
    } catch (const std::exception& e) {
      DS_LOG_ERROR("engine: failed, no longer serving: " << e.what());
      fail_everything(Status(StatusCode::kUnavailable, std::string("the engine failed: ") + e.what()));
      return;
    }
  }
}

bool AsyncEngine::run_once() {
  std::deque<Pending> inbox;
  std::vector<RequestId> cancels;
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox.swap(inbox_);
    cancels.swap(cancels_);
    stopping = stopping_;
  }
  for (Pending& p : inbox) {
    Status st = core_->add_request(p.id, p.request);
    if (!st.ok()) {
      RequestOutput out;
      out.request_id = p.id;
      out.finish_reason = FinishReason::kError;
      out.error = st;
      p.callback(out);
      --num_unfinished_;
      continue;
    }
    callbacks_.emplace(p.id, std::move(p.callback));
  }
  if (stopping) {
    for (auto& [id, cb] : callbacks_) cancels.push_back(id);
  }
  for (RequestId id : cancels) {
    auto out = core_->abort_request(id);
    auto it = callbacks_.find(id);
    if (out && it != callbacks_.end()) {
      it->second(*out);
      callbacks_.erase(it);
      --num_unfinished_;
    }
  }
  if (stopping) return true;
  if (core_->has_unfinished_requests()) {
    for (const RequestOutput& out : core_->step()) {
      auto it = callbacks_.find(out.request_id);
      if (it == callbacks_.end()) continue;
      it->second(out);
      if (out.finished()) {
        callbacks_.erase(it);
        --num_unfinished_;
      }
    }
  }
  kv::KvCacheMetrics kv_metrics = core_->kv_cache().metrics();
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = core_->stats();
  kv_metrics_ = std::move(kv_metrics);
  return false;
}

void AsyncEngine::fail_everything(const Status& error) {
  std::deque<Pending> inbox;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = error;
    accepting_ = false;
    inbox.swap(inbox_);
  }
  for (Pending& p : inbox) callbacks_.emplace(p.id, std::move(p.callback));
  for (auto& [id, callback] : callbacks_) {
    RequestOutput out;
    out.request_id = id;
    out.finish_reason = FinishReason::kError;
    out.error = error;
    --num_unfinished_;
    callback(out);
  }
  callbacks_.clear();
}

Status AsyncEngine::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

std::string AsyncEngine::metrics_text() const {
  kv::KvCacheMetrics m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m = kv_metrics_;
  }
  return kv::format_kv_metrics(m);
}

}  // namespace dsinfer
