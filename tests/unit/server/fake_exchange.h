// An in-memory HttpExchange and a single-threaded "I/O loop" for driving ApiServer in tests.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

#include "server/http_exchange.h"

namespace dsinfer::server::testing {

// Functions posted from the engine thread, run on the test thread by run_until().
class TestLoop {
 public:
  void post(std::function<void()> fn) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_all();
  }
  // Runs posted work until `done()` or 10 s pass (a hang fails the test instead of blocking).
  bool run_until(const std::function<bool()>& done) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done()) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mutex_);
        if (!cv_.wait_until(lock, deadline, [&] { return !queue_.empty(); })) return false;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
    return true;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
};

class FakeExchange : public HttpExchange {
 public:
  explicit FakeExchange(TestLoop& loop, size_t max_write_bytes = SIZE_MAX) : loop_(loop), max_write_bytes_(max_write_bytes) {}

  void respond(int status, std::string_view content_type, std::string body,
               std::vector<std::pair<std::string, std::string>>) override {
    if (closed_) return;
    status_ = status;
    content_type_ = content_type;
    body_ = std::move(body);
    complete_ = true;
  }
  void start_stream(int status, std::string_view content_type) override {
    status_ = status;
    content_type_ = content_type;
    streaming_ = true;
  }
  bool write(std::string data) override {
    if (closed_) return false;
    if (body_.size() + data.size() > max_write_bytes_) {
      disconnect();
      return false;
    }
    body_ += data;
    return true;
  }
  void end_stream() override { complete_ = true; }
  void set_on_close(std::function<void()> fn) override { on_close_ = std::move(fn); }
  bool closed() const override { return closed_ || complete_; }
  void post(std::function<void()> fn) override { loop_.post(std::move(fn)); }

  // The client hangs up.
  void disconnect() {
    if (closed_) return;
    closed_ = true;
    if (!complete_ && on_close_) std::exchange(on_close_, nullptr)();
  }

  int status() const { return status_; }
  const std::string& body() const { return body_; }
  const std::string& content_type() const { return content_type_; }
  bool complete() const { return complete_; }
  bool streaming() const { return streaming_; }

 private:
  TestLoop& loop_;
  size_t max_write_bytes_;
  int status_ = 0;
  std::string content_type_;
  std::string body_;
  bool complete_ = false;
  bool streaming_ = false;
  bool closed_ = false;
  std::function<void()> on_close_;
};

}  // namespace dsinfer::server::testing
