// The HTTP API: routes, API-key check, admission (queue limit, draining), protocol errors, and
// generation sessions. Plain C++ over HttpExchange; HttpServer feeds it requests.
//
// Routes: POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages and
// /anthropic/v1/messages; GET /v1/models, /v1/models/{id}, /health, /metrics. With an API key
// every /v1 route needs `Authorization: Bearer KEY` or `x-api-key: KEY`; /health and /metrics
// stay open (probes and scrapers). Everything runs on the I/O thread except the marked calls.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "codec/api_request.h"
#include "dsinfer/engine_client.h"
#include "server/http_exchange.h"
#include "server/model_codec.h"
#include "server/output_inbox.h"
#include "server/server_metrics.h"

namespace dsinfer::server {

class GenerationSession;

struct ApiServerOptions {
  std::string served_model_name = "dsinfer";
  std::string api_key;   // empty: no authentication
  int max_queued = 1024;  // admitted requests without a first token yet; beyond → 429
  int64_t created_s = 0;  // /v1/models "created"
};

class ApiServer {
 public:
  explicit ApiServer(ApiServerOptions options);
  ~ApiServer();

  // Makes the model available; /health turns ready. Thread-safe; call once. The engine and
  // codec must outlive the server's I/O loop.
  void set_model(EngineClient* engine, const ModelCodec* codec);

  // The RequestHandler.
  void handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange);

  // New generation requests get 503 and /health reports not ready. Thread-safe.
  void start_draining();
  // Generation requests in flight. Thread-safe.
  int num_active_requests() const { return num_active_.load(); }
  // Cancels every request in flight and ends its response (shutdown past the grace period).
  void abort_all();

  ServerMetrics& metrics() { return metrics_; }
  // Where /metrics reads the open-connection count (HttpServer::num_open_connections).
  void set_connection_counter(std::function<int()> counter) { connection_counter_ = std::move(counter); }

 private:
  void route(HttpRequest& request, const std::shared_ptr<HttpExchange>& exchange);
  void generate(const std::string& route, codec::ApiProtocol protocol, HttpRequest& request, std::shared_ptr<HttpExchange> exchange);
  void respond_error(const std::string& route, codec::ApiProtocol protocol, HttpExchange& exchange, int status,
                     const std::string& code, const std::string& param, const std::string& message);
  std::string new_id(const char* prefix);

  ApiServerOptions options_;
  std::atomic<EngineClient*> engine_{nullptr};
  std::atomic<const ModelCodec*> codec_{nullptr};
  std::atomic<bool> draining_{false};
  std::atomic<int> num_active_{0};
  int num_queued_ = 0;   // I/O thread
  int num_running_ = 0;  // I/O thread
  uint64_t next_session_ = 0;
  std::map<uint64_t, std::shared_ptr<GenerationSession>> sessions_;
  ServerMetrics metrics_;
  std::shared_ptr<OutputInbox> inbox_ = std::make_shared<OutputInbox>();
  std::function<int()> connection_counter_;
  std::mt19937_64 rng_;
};

}  // namespace dsinfer::server
