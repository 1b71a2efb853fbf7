// Prometheus text rendering. Names follow the dsinfer_<thing>_<unit> convention.
#include "server/server_metrics.h"

#include <cstdio>

namespace dsinfer::server {

namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const std::string& name, double value) {
  out += name;
  out += ' ';
  out += number(value);
  out += '\n';
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds_s) : bounds_s_(std::move(bounds_s)), counts_(bounds_s_.size() + 1, 0) {}

void Histogram::observe(double value_s) {
  size_t i = 0;
  while (i < bounds_s_.size() && value_s > bounds_s_[i]) ++i;
  std::lock_guard lock(mutex_);
  ++counts_[i];
  sum_s_ += value_s;
  ++count_;
}

uint64_t Histogram::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

void Histogram::render(const std::string& name, std::string& out) const {
  std::lock_guard lock(mutex_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_s_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + number(bounds_s_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum " + number(sum_s_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}),
      e2e_({0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0}) {}

void ServerMetrics::count_request(const std::string& route, int http_status) {
  std::lock_guard lock(requests_mutex_);
  ++requests_[{route, http_status}];
}

uint64_t ServerMetrics::num_requests(const std::string& route, int http_status) const {
  std::lock_guard lock(requests_mutex_);
  auto it = requests_.find({route, http_status});
  return it == requests_.end() ? 0 : it->second;
}

std::string ServerMetrics::render(const ServerGauges& g) const {
  std::string out;
  header(out, "dsinfer_requests_total", "counter", "HTTP requests answered, by route and status code.");
  {
    std::lock_guard lock(requests_mutex_);
    for (const auto& [key, n] : requests_) {
      out += "dsinfer_requests_total{route=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " +
             std::to_string(n) + "\n";
    }
  }
  header(out, "dsinfer_requests_cancelled_total", "counter", "Generation requests cancelled (client gone, too slow, stop string).");
  sample(out, "dsinfer_requests_cancelled_total", static_cast<double>(num_cancelled_.load()));
  header(out, "dsinfer_time_to_first_token_seconds", "histogram", "Time from request arrival to its first generated token.");
  ttft_.render("dsinfer_time_to_first_token_seconds", out);
  header(out, "dsinfer_inter_token_latency_seconds", "histogram", "Time between consecutive generated tokens of a request.");
  itl_.render("dsinfer_inter_token_latency_seconds", out);
  header(out, "dsinfer_request_latency_seconds", "histogram", "Time from request arrival to its last token.");
  e2e_.render("dsinfer_request_latency_seconds", out);
  header(out, "dsinfer_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.");
  sample(out, "dsinfer_prompt_tokens_total", static_cast<double>(num_prompt_tokens_.load()));
  header(out, "dsinfer_cached_prompt_tokens_total", "counter", "Prompt tokens served from the prefix cache.");
  sample(out, "dsinfer_cached_prompt_tokens_total", static_cast<double>(num_cached_prompt_tokens_.load()));
  header(out, "dsinfer_generated_tokens_total", "counter", "Generated tokens.");
  sample(out, "dsinfer_generated_tokens_total", static_cast<double>(num_generated_tokens_.load()));
  header(out, "dsinfer_queued_requests", "gauge", "Requests admitted and waiting for their first token.");
  sample(out, "dsinfer_queued_requests", g.num_queued_requests);
  header(out, "dsinfer_running_requests", "gauge", "Requests producing tokens.");
  sample(out, "dsinfer_running_requests", g.num_running_requests);
  header(out, "dsinfer_open_connections", "gauge", "Open HTTP connections.");
  sample(out, "dsinfer_open_connections", g.num_open_connections);
  if (g.have_engine) {
    header(out, "dsinfer_engine_waiting_requests", "gauge", "Requests in the engine's waiting queue.");
    sample(out, "dsinfer_engine_waiting_requests", g.engine.num_waiting);
    header(out, "dsinfer_engine_running_requests", "gauge", "Requests in the engine's running batch.");
    sample(out, "dsinfer_engine_running_requests", g.engine.num_running);
    header(out, "dsinfer_kv_blocks_used", "gauge", "KV cache blocks in use.");
    sample(out, "dsinfer_kv_blocks_used", g.engine.num_kv_blocks_used);
    header(out, "dsinfer_kv_blocks_total", "gauge", "KV cache blocks in the pool.");
    sample(out, "dsinfer_kv_blocks_total", g.engine.num_kv_blocks_total);
    header(out, "dsinfer_engine_steps_total", "counter", "Engine steps run.");
    sample(out, "dsinfer_engine_steps_total", static_cast<double>(g.engine.num_steps));
    header(out, "dsinfer_engine_preemptions_total", "counter", "Requests preempted by the engine.");
    sample(out, "dsinfer_engine_preemptions_total", static_cast<double>(g.engine.num_preemptions));
    header(out, "dsinfer_engine_replayed_steps_total", "counter",
           "Decode steps replayed from recordings (CUDA graphs) instead of issued kernel by kernel.");
    sample(out, "dsinfer_engine_replayed_steps_total", static_cast<double>(g.engine.num_replayed_steps));
    header(out, "dsinfer_engine_failed_steps_total", "counter",
           "Engine steps whose launch failed (out of device memory, say); see dsinfer_engine_step_token_budget.");
    sample(out, "dsinfer_engine_failed_steps_total", static_cast<double>(g.engine.num_failed_steps));
    if (g.engine.step_token_budget > 0) {  // engines with a step budget (not the echo engine)
      header(out, "dsinfer_engine_step_token_budget", "gauge",
             "Tokens an engine step may take (lowered after a step ran out of device memory).");
      sample(out, "dsinfer_engine_step_token_budget", g.engine.step_token_budget);
    }
  }
  return out;
}

}  // namespace dsinfer::server
