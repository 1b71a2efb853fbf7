// `dsinfer bench-serve`: a load generator for `dsinfer serve` (or any server of the same APIs).
// Sends N streaming requests at a fixed concurrency or a Poisson arrival rate, with prompts of a
// given token length and a fixed number of output tokens (ignore_eos), and reports time to
// first token, inter-token latency and end-to-end latency (p50/p90/p99), request and token
// throughput, and failures. One I/O thread drives every connection (Asio), so thousands of
// concurrent streams need no thread each.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/asio.hpp>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_plot.h"
#include "command.h"

namespace dsinfer::cli {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint = "completions";  // completions (token-id prompts) | chat
  std::string model = "echo";
  std::string api_key;
  int num_requests = 100;
  int concurrency = 10;
  double request_rate = 0;  // requests/s; 0 = all as fast as concurrency allows
  int input_tokens = 32;
  int output_tokens = 64;
  int min_prompt_id = 100, max_prompt_id = 200;
  uint64_t seed = 0;
  std::string plot_path;
  std::string json_path;
};

struct RequestResult {
  bool ok = false;
  bool has_text = false;
  std::string error;
  double ttft_s = 0, e2e_s = 0;
  std::vector<double> itl_s;
  int num_output_tokens = 0;
};

class StreamRequest : public std::enable_shared_from_this<StreamRequest> {
 public:
  StreamRequest(asio::io_context& io, tcp::endpoint endpoint, std::string http_request, RequestResult& result,
                std::function<void()> on_done)
      : socket_(io), endpoint_(endpoint), request_(std::move(http_request)), result_(result), on_done_(std::move(on_done)) {}

  void start() {
    start_ = Clock::now();
    socket_.async_connect(endpoint_, [self = shared_from_this()](boost::system::error_code ec) {
      if (ec) return self->fail("connect: " + ec.message());
      asio::async_write(self->socket_, asio::buffer(self->request_), [self](boost::system::error_code ec, size_t) {
        if (ec) return self->fail("write: " + ec.message());
        self->read();
      });
    });
  }

 private:
  void read() {
    socket_.async_read_some(asio::buffer(chunk_), [self = shared_from_this()](boost::system::error_code ec, size_t n) {
      if (n > 0) self->consume(std::string_view(self->chunk_.data(), n));
      if (self->finished_) return;
      if (ec) {
        if (ec == asio::error::eof && self->done_seen_) return self->finish();
        return self->fail(ec == asio::error::eof ? "connection closed before [DONE] (status " + std::to_string(self->status_) + ")"
                                                 : "read: " + ec.message());
      }
      self->read();
    });
  }

  void consume(std::string_view bytes) {
    raw_ += bytes;
    if (status_ == 0) {
      size_t end = raw_.find("\r\n\r\n");
      if (end == std::string::npos) return;
      status_ = std::atoi(raw_.c_str() + 9);
      chunked_ = raw_.find("Transfer-Encoding: chunked") < end;
      raw_.erase(0, end + 4);
      if (status_ != 200) {
        // Read the error body to the end for the message; fail then.
        return;
      }
    }
    if (status_ != 200 || !chunked_) return;
    // De-chunk what is complete.
    while (true) {
      size_t line_end = raw_.find("\r\n");
      if (line_end == std::string::npos) return;
      size_t size = std::strtoul(raw_.c_str(), nullptr, 16);
      if (raw_.size() < line_end + 2 + size + 2) return;
      sse_.append(raw_, line_end + 2, size);
      raw_.erase(0, line_end + 2 + size + 2);
      if (size == 0) {
        finish();
        return;
      }
      parse_events();
    }
  }

  void parse_events() {
    size_t end;
    while ((end = sse_.find("\n\n")) != std::string::npos) {
      std::string event = sse_.substr(0, end);
      sse_.erase(0, end + 2);
      size_t data = event.find("data: ");
      if (data == std::string::npos) continue;
      std::string payload = event.substr(data + 6);
      if (payload == "[DONE]") {
        done_seen_ = true;
        continue;
      }
      // Only the usage chunk is parsed; token chunks are recognised by a scan, so the client
      // spends little of the machine the server runs on.
      if (payload.find("\"usage\":{") != std::string::npos) {
        auto j = nlohmann::json::parse(payload, nullptr, false);
        if (!j.is_discarded() && j["usage"].is_object()) result_.num_output_tokens = j["usage"].value("completion_tokens", 0);
        continue;
      }
      if (!has_text(payload)) continue;
      auto now = Clock::now();
      if (!first_token_) {
        result_.ttft_s = std::chrono::duration<double>(now - start_).count();
        first_token_ = true;
      } else {
        result_.itl_s.push_back(std::chrono::duration<double>(now - last_token_).count());
      }
      last_token_ = now;
    }
  }

  // Whether a chunk carries a non-empty "text", "content" or "reasoning_content" string.
  static bool has_text(const std::string& payload) {
    for (const char* key : {"\"text\":\"", "\"content\":\"", "\"reasoning_content\":\""}) {
      size_t at = payload.find(key);
      if (at != std::string::npos && payload[at + std::strlen(key)] != '"') return true;
    }
    return false;
  }

  void finish() {
    if (finished_) return;
    finished_ = true;
    result_.e2e_s = std::chrono::duration<double>(Clock::now() - start_).count();
    // A stream that completed is a success even if no token carried text (a model may emit only
    // special tokens); it just has no TTFT.
    result_.ok = done_seen_;
    result_.has_text = first_token_;
    if (!result_.ok) result_.error = "stream ended without [DONE]";
    boost::system::error_code ignored;
    socket_.close(ignored);
    on_done_();
  }

  void fail(const std::string& why) {
    if (finished_) return;
    finished_ = true;
    result_.ok = false;
    result_.error = status_ > 0 && status_ != 200 ? "HTTP " + std::to_string(status_) + ": " + raw_.substr(0, 200) : why;
    boost::system::error_code ignored;
    socket_.close(ignored);
    on_done_();
  }

  tcp::socket socket_;
  tcp::endpoint endpoint_;
  std::string request_;
  RequestResult& result_;
  std::function<void()> on_done_;
  std::array<char, 16384> chunk_{};
  std::string raw_, sse_;
  int status_ = 0;
  bool chunked_ = false;
  bool done_seen_ = false;
  bool first_token_ = false;
  bool finished_ = false;
  Clock::time_point start_, last_token_;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double rank = p / 100.0 * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(rank);
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

std::string make_body(const BenchOptions& o, std::mt19937_64& rng) {
  nlohmann::json body = {{"model", o.model}, {"stream", true}, {"max_tokens", o.output_tokens}, {"ignore_eos", true},
                         {"temperature", 0}, {"stream_options", {{"include_usage", true}}}};
  std::uniform_int_distribution<int> id(o.min_prompt_id, o.max_prompt_id - 1);
  if (o.endpoint == "chat") {
    // One short word per requested token: the exact count depends on the tokenizer.
    static const char* kWords[] = {" the", " a", " of", " and", " to", " in", " is", " it"};
    std::string text;
    for (int i = 0; i < o.input_tokens; ++i) text += kWords[id(rng) % 8];
    body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", text}}});
  } else {
    std::vector<int> ids(static_cast<size_t>(o.input_tokens));
    for (auto& x : ids) x = id(rng);
    body["prompt"] = ids;
  }
  return body.dump();
}

int run_bench_serve(int argc, char** argv) {
  CLI::App app("Load generator for the serving API: latency percentiles, throughput, failures", "dsinfer bench-serve");
  BenchOptions o;
  app.add_option("--host", o.host);
  app.add_option("--port", o.port)->check(CLI::Range(1, 65535));
  app.add_option("--endpoint", o.endpoint, "completions (token-id prompts, exact lengths) or chat")->check(CLI::IsMember({"completions", "chat"}));
  app.add_option("--model", o.model, "model name sent in requests");
  app.add_option("--api-key", o.api_key);
  app.add_option("--num-requests", o.num_requests)->check(CLI::Range(1, 10000000));
  app.add_option("--concurrency", o.concurrency, "requests in flight at most")->check(CLI::Range(1, 100000));
  app.add_option("--request-rate", o.request_rate, "Poisson arrivals per second (0: as fast as concurrency allows)")->check(CLI::Range(0.0, 1e6));
  app.add_option("--input-tokens", o.input_tokens)->check(CLI::Range(1, 1 << 20));
  app.add_option("--output-tokens", o.output_tokens)->check(CLI::Range(1, 1 << 20));
  app.add_option("--min-prompt-id", o.min_prompt_id, "prompt ids are drawn from [min, max)")->check(CLI::Range(0, 1 << 30));
  app.add_option("--max-prompt-id", o.max_prompt_id)->check(CLI::Range(1, 1 << 30));
  app.add_option("--seed", o.seed);
  app.add_option("--plot", o.plot_path, "write latency CDFs to this PNG");
  app.add_option("--json", o.json_path, "write the summary as JSON here");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (o.max_prompt_id <= o.min_prompt_id) {
    std::fprintf(stderr, "dsinfer bench-serve: --max-prompt-id must exceed --min-prompt-id\n");
    return 2;
  }

  asio::io_context io(1);
  boost::system::error_code ec;
  tcp::endpoint endpoint(asio::ip::make_address(o.host, ec), static_cast<unsigned short>(o.port));
  if (ec) {
    std::fprintf(stderr, "dsinfer bench-serve: bad --host: %s\n", ec.message().c_str());
    return 2;
  }
  std::mt19937_64 rng(o.seed);
  const std::string path = o.endpoint == "chat" ? "/v1/chat/completions" : "/v1/completions";
  std::vector<RequestResult> results(static_cast<size_t>(o.num_requests));
  std::vector<std::string> requests;
  requests.reserve(results.size());
  for (int i = 0; i < o.num_requests; ++i) {
    std::string body = make_body(o, rng);
    std::string r = "POST " + path + " HTTP/1.1\r\nHost: " + o.host + "\r\nContent-Type: application/json\r\nConnection: close\r\n";
    if (!o.api_key.empty()) r += "Authorization: Bearer " + o.api_key + "\r\n";
    r += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    requests.push_back(std::move(r));
  }
  // Arrival times (seconds from the start) for rate-limited runs.
  std::vector<double> arrivals(results.size(), 0.0);
  if (o.request_rate > 0) {
    std::exponential_distribution<double> gap(o.request_rate);
    double t = 0;
    for (auto& a : arrivals) {
      a = t;
      t += gap(rng);
    }
  }

  int next = 0, in_flight = 0, num_done = 0;
  auto run_start = Clock::now();
  asio::steady_timer timer(io);
  std::function<void()> launch;
  launch = [&] {
    while (next < o.num_requests && in_flight < o.concurrency) {
      double due = arrivals[static_cast<size_t>(next)];
      double now = std::chrono::duration<double>(Clock::now() - run_start).count();
      if (due > now) {
        timer.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(due - now)));
        timer.async_wait([&](boost::system::error_code e) { if (!e) launch(); });
        return;
      }
      int i = next++;
      ++in_flight;
      std::make_shared<StreamRequest>(io, endpoint, requests[static_cast<size_t>(i)], results[static_cast<size_t>(i)], [&] {
        --in_flight;
        ++num_done;
        asio::post(io, [&] { launch(); });
      })->start();
    }
  };
  launch();
  io.run();
  double duration_s = std::chrono::duration<double>(Clock::now() - run_start).count();

  std::vector<double> ttft, itl, e2e;
  int num_ok = 0, num_without_text = 0;
  int64_t num_output_tokens = 0;
  std::string first_error;
  for (const auto& r : results) {
    if (!r.ok) {
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++num_ok;
    if (!r.has_text) ++num_without_text;
    else ttft.push_back(r.ttft_s * 1e3);
    e2e.push_back(r.e2e_s * 1e3);
    for (double x : r.itl_s) itl.push_back(x * 1e3);
    num_output_tokens += r.num_output_tokens;
  }
  int num_failed = o.num_requests - num_ok;
  std::printf("requests: %d ok, %d failed, %.2f s, concurrency %d, rate %s\n", num_ok, num_failed, duration_s, o.concurrency,
              o.request_rate > 0 ? std::to_string(o.request_rate).c_str() : "unlimited");
  std::printf("throughput: %.2f requests/s, %.1f output tokens/s\n", num_ok / duration_s, num_output_tokens / duration_s);
  std::printf("%-10s %10s %10s %10s %10s\n", "ms", "mean", "p50", "p90", "p99");
  auto row = [](const char* name, const std::vector<double>& v) {
    double mean = 0;
    for (double x : v) mean += x;
    mean = v.empty() ? 0 : mean / static_cast<double>(v.size());
    std::printf("%-10s %10.2f %10.2f %10.2f %10.2f\n", name, mean, percentile(v, 50), percentile(v, 90), percentile(v, 99));
  };
  row("TTFT", ttft);
  row("ITL", itl);
  row("E2E", e2e);
  if (num_without_text > 0) std::printf("%d completed streams carried no text (no TTFT sample)\n", num_without_text);
  if (!first_error.empty()) std::printf("first failure: %s\n", first_error.c_str());

  if (!o.json_path.empty()) {
    nlohmann::json summary = {
        {"num_requests", o.num_requests}, {"num_ok", num_ok}, {"num_failed", num_failed}, {"num_without_text", num_without_text}, {"duration_s", duration_s},
        {"request_throughput", num_ok / duration_s}, {"output_token_throughput", num_output_tokens / duration_s},
        {"num_output_tokens", num_output_tokens},
        {"ttft_ms", {{"p50", percentile(ttft, 50)}, {"p90", percentile(ttft, 90)}, {"p99", percentile(ttft, 99)}}},
        {"itl_ms", {{"p50", percentile(itl, 50)}, {"p90", percentile(itl, 90)}, {"p99", percentile(itl, 99)}}},
        {"e2e_ms", {{"p50", percentile(e2e, 50)}, {"p90", percentile(e2e, 90)}, {"p99", percentile(e2e, 99)}}}};
    std::ofstream(o.json_path) << summary.dump(2) << "\n";
  }
  if (!o.plot_path.empty()) {
    std::string error;
    std::vector<PlotPanel> panels = {
        {"TIME TO FIRST TOKEN AND END TO END", "MS", {{"TTFT", 0x1F77B4, ttft}, {"E2E", 0x2CA02C, e2e}}},
        {"INTER-TOKEN LATENCY", "MS", {{"ITL", 0xD62728, itl}}},
    };
    char title[160];
    std::snprintf(title, sizeof(title), "BENCH-SERVE: %d REQUESTS, CONCURRENCY %d, IN %d / OUT %d TOKENS", o.num_requests,
                  o.concurrency, o.input_tokens, o.output_tokens);
    if (!write_cdf_plot_png(o.plot_path, title, panels, &error)) {
      std::fprintf(stderr, "dsinfer bench-serve: %s\n", error.c_str());
      return 1;
    }
    std::printf("plot: %s\n", o.plot_path.c_str());
  }
  return num_failed == 0 ? 0 : 3;
}

}  // namespace
}  // namespace dsinfer::cli

DSINFER_REGISTER_COMMAND(bench_serve, "bench-serve", "load-test a serving endpoint (latency percentiles, throughput)",
                         dsinfer::cli::run_bench_serve);
