// The server's Prometheus metrics: request counts by route and status, latency histograms,
// token counters, and gauges read from the engine when scraped. Thread-safe; updates are
// lock-free counters except histogram observations (one short mutex).
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dsinfer/engine_types.h"

namespace dsinfer::server {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds_s);
  void observe(double value_s);
  // Appends the _bucket/_sum/_count lines of metric `name`.
  void render(const std::string& name, std::string& out) const;
  uint64_t count() const;

 private:
  std::vector<double> bounds_s_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // one per bound, plus +Inf
  double sum_s_ = 0.0;
  uint64_t count_ = 0;
};

struct ServerGauges {
  int num_queued_requests = 0;    // admitted by the server, not yet producing tokens
  int num_running_requests = 0;   // producing tokens
  int num_open_connections = 0;
  EngineStats engine;
  bool have_engine = false;
};

class ServerMetrics {
 public:
  ServerMetrics();

  void count_request(const std::string& route, int http_status);
  void observe_time_to_first_token(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token_latency(double seconds) { itl_.observe(seconds); }
  void observe_request_latency(double seconds) { e2e_.observe(seconds); }
  void add_prompt_tokens(int n) { num_prompt_tokens_ += n; }
  void add_cached_prompt_tokens(int n) { num_cached_prompt_tokens_ += n; }
  void add_generated_tokens(int n) { num_generated_tokens_ += n; }
  void count_cancelled() { ++num_cancelled_; }

  uint64_t num_requests(const std::string& route, int http_status) const;
  uint64_t num_cancelled() const { return num_cancelled_; }

  // The Prometheus text exposition (version 0.0.4).
  std::string render(const ServerGauges& gauges) const;

 private:
  mutable std::mutex requests_mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  std::atomic<uint64_t> num_prompt_tokens_{0};
  std::atomic<uint64_t> num_cached_prompt_tokens_{0};
  std::atomic<uint64_t> num_generated_tokens_{0};
  std::atomic<uint64_t> num_cancelled_{0};
};

}  // namespace dsinfer::server
