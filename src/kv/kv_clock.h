// Wall-clock time for cache retention, injectable so tests can move time forward. Times are
// Unix milliseconds because they end up in file timestamps shared by several processes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace dsinfer::kv {

class KvClock {
 public:
  virtual ~KvClock() = default;
  virtual int64_t now_ms() const = 0;
};

class SystemKvClock final : public KvClock {
 public:
  int64_t now_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch()).count();
  }
};

// A clock that moves only when told to; starts at the real time so file times stay plausible.
class ManualKvClock final : public KvClock {
 public:
  ManualKvClock() : now_ms_(SystemKvClock().now_ms()) {}
  int64_t now_ms() const override { return now_ms_.load(); }
  void advance_ms(int64_t delta_ms) { now_ms_ += delta_ms; }
  void set_ms(int64_t t_ms) { now_ms_ = t_ms; }

 private:
  std::atomic<int64_t> now_ms_;
};

}  // namespace dsinfer::kv
