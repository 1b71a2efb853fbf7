// Carries engine outputs from the engine thread to the I/O thread in batches: the engine calls
// every running request's callback once per step, and posting each one separately would wake the
// I/O thread once per request per step. Work pushed while a drain is already pending rides along
// with it, so a step's outputs usually cost one wake-up.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "server/http_exchange.h"

namespace dsinfer::server {

class OutputInbox : public std::enable_shared_from_this<OutputInbox> {
 public:
  // Thread-safe. `via` is any exchange of the server: its post() reaches the I/O thread.
  void push(std::function<void()> fn, HttpExchange& via) {
    bool schedule = false;
    {
      std::lock_guard lock(mutex_);
      schedule = pending_.empty();
      pending_.push_back(std::move(fn));
    }
    if (schedule) via.post([self = shared_from_this()] { self->drain(); });
  }

 private:
  void drain() {
    std::vector<std::function<void()>> batch;
    {
      std::lock_guard lock(mutex_);
      batch.swap(pending_);
    }
    for (auto& fn : batch) fn();
  }

  std::mutex mutex_;
  std::vector<std::function<void()>> pending_;
};

}  // namespace dsinfer::server
