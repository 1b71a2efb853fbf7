// `dsinfer serve`: the HTTP API in the engine's process.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "command.h"
#include "core/logging.h"
#include "engine/async_engine.h"
#include "engine_options.h"
#include "server/api_server.h"
#include "server/byte_codec.h"
#include "server/deepseek_codec.h"
#include "server/echo_engine.h"
#include "server/http_server.h"

namespace {

const char* kServeDescription =
    "Serves /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages (also\n"
    "/anthropic/v1/messages), /v1/models, /health and /metrics.\n"
    "--engine echo answers without a model (each request gets its last message back, one byte\n"
    "per token): it exercises the server and its clients alone.\n"
    "SIGTERM/SIGINT: stop accepting, let requests finish for up to --grace-period-s, exit 0.";

int run_serve(int argc, char** argv) {
  CLI::App app(kServeDescription, "dsinfer serve");
  dsinfer::cli::EngineOptions engine_options;
  // A server keeps its prompt KV on disk by default (~/.cache/dsinfer/kv, or --kv-store DIR),
  // so restarts and sibling processes on the same directory hit it; --no-kv-store turns it off.
  engine_options.kv_store_by_default = true;
  dsinfer::cli::add_engine_options(app, engine_options);
  dsinfer::server::HttpServerOptions http_options;
  dsinfer::server::ApiServerOptions api_options;
  api_options.served_model_name.clear();
  std::string engine_kind = "model";
  int64_t grace_period_s = 30;
  int max_context_tokens = 4096;
  int echo_step_us = 1000;
  app.add_option("--host", http_options.host, "address to listen on");
  app.add_option("--port", http_options.port, "port (0 picks a free one)")->check(CLI::Range(0, 65535));
  app.add_option("--api-key", api_options.api_key, "require this key (Authorization: Bearer, or x-api-key)");
  app.add_option("--served-model-name", api_options.served_model_name, "the model name clients use (default: the directory's name)");
  app.add_option("--max-queued", api_options.max_queued, "requests waiting for their first token before 429")->check(CLI::Range(1, 1 << 30));
  app.add_option("--max-body-bytes", http_options.max_body_bytes, "largest request body (413 beyond)")->check(CLI::Range(1024ll, 1ll << 32));
  app.add_option("--grace-period-s", grace_period_s, "how long SIGTERM waits for requests in flight")->check(CLI::Range(0, 86400));
  app.add_option("--engine", engine_kind, "model: the engine core; echo: a scripted engine, no model")->check(CLI::IsMember({"model", "echo"}));
  app.add_option("--max-context-tokens", max_context_tokens, "echo engine: its context window")->check(CLI::Range(16, 1 << 24));
  app.add_option("--echo-step-us", echo_step_us, "echo engine: time per step")->check(CLI::Range(0, 10000000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  dsinfer::EngineConfig config = dsinfer::cli::finish_engine_options(engine_options);
  if (api_options.served_model_name.empty()) {
    api_options.served_model_name =
        engine_kind == "echo" ? "echo" : std::filesystem::path(config.model_dir).lexically_normal().filename().string();
    if (api_options.served_model_name.empty()) api_options.served_model_name = "dsinfer";
  }

  // Signals are taken synchronously by this thread; every thread started below inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  dsinfer::server::ApiServer api(api_options);
  dsinfer::server::HttpServer http(http_options, [&api](dsinfer::server::HttpRequest request,
                                                        std::shared_ptr<dsinfer::server::HttpExchange> exchange) {
    api.handle(std::move(request), std::move(exchange));
  });
  api.set_connection_counter([&http] { return http.num_open_connections(); });
  if (auto status = http.listen(); !status.ok()) {
    std::fprintf(stderr, "dsinfer serve: %s\n", status.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "dsinfer serve: listening on http://%s:%d (model '%s')\n", http_options.host.c_str(), http.port(),
               api_options.served_model_name.c_str());
  std::fflush(stderr);
  std::thread io_thread([&http] { http.run(); });

  // The model loads while /health says "loading".
  std::unique_ptr<dsinfer::EngineClient> engine;
  std::unique_ptr<dsinfer::server::ModelCodec> model_codec;
  dsinfer::server::EchoEngine* echo = nullptr;
  dsinfer::AsyncEngine* async_engine = nullptr;
  try {
    if (engine_kind == "echo") {
      dsinfer::server::EchoEngineOptions options;
      options.max_context_tokens = max_context_tokens;
      options.step_interval_us = echo_step_us;
      options.max_running = 4096;
      auto e = std::make_unique<dsinfer::server::EchoEngine>(options);
      echo = e.get();
      engine = std::move(e);
      model_codec = std::make_unique<dsinfer::server::ByteCodec>();
    } else {
      auto e = std::make_unique<dsinfer::AsyncEngine>(config);
      model_codec = dsinfer::server::DeepseekCodec::load(config.model_dir, e->model_config().vocab_size);
      async_engine = e.get();
      engine = std::move(e);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsinfer serve: cannot load the model from %s: %s\n", config.model_dir.c_str(), e.what());
    http.stop();
    io_thread.join();
    return 1;
  }
  api.set_model(engine.get(), model_codec.get());
  std::fprintf(stderr, "dsinfer serve: ready\n");
  std::fflush(stderr);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::fprintf(stderr, "dsinfer serve: %s: draining (grace period %llds)\n", strsignal(signal_number),
               static_cast<long long>(grace_period_s));
  api.start_draining();
  http.stop_accepting();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace_period_s);
  while (api.num_active_requests() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (api.num_active_requests() > 0) {
    std::fprintf(stderr, "dsinfer serve: grace period over; cancelling %d requests\n", api.num_active_requests());
    http.post([&api] { api.abort_all(); });
  }
  // Let the last bytes reach the clients before closing.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  http.stop();
  io_thread.join();
  if (echo) echo->shutdown();
  if (async_engine) async_engine->shutdown();
  std::fprintf(stderr, "dsinfer serve: stopped\n");
  return 0;
}

}  // namespace

DSINFER_REGISTER_COMMAND(serve, "serve", "serve the model over HTTP (OpenAI and Anthropic APIs)", run_serve);
