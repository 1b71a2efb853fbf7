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
#include "server/api_server.h"
#include "server/byte_codec.h"
#include "server/echo_engine.h"
#include "server/http_server.h"

namespace {

void print_help() {
  std::fprintf(stderr,
               "usage: dsinfer serve [--model DIR] [--host 127.0.0.1] [--port 8000] [--api-key KEY]\n"
               "                     [--served-model-name NAME] [--max-queued N] [--max-body-bytes N]\n"
               "                     [--backend cpu|cuda] [--grace-period-s S] [--engine model|echo]\n"
               "                     [--max-context-tokens N] [--echo-step-us US]\n\n"
               "Serves /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages\n"
               "(also /anthropic/v1/messages), /v1/models, /health and /metrics.\n"
               "--engine echo answers without a model (each request gets its last message back,\n"
               "one byte per token); it exercises the server and its clients alone.\n"
               "SIGTERM/SIGINT: stop accepting, finish requests for up to --grace-period-s, exit 0.\n");
}

bool parse_int(const char* text, long long min_value, long long max_value, long long& out) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text, &end, 10);
  if (errno || !end || *end || end == text || v < min_value || v > max_value) return false;
  out = v;
  return true;
}

int run_serve(int argc, char** argv) {
  std::string model_dir = dsinfer::cli::default_model_dir();
  std::string engine_kind = "model";
  std::string backend = "cpu";
  dsinfer::server::HttpServerOptions http_options;
  dsinfer::server::ApiServerOptions api_options;
  api_options.served_model_name.clear();
  long long grace_period_s = 30;
  long long max_context_tokens = 4096;
  long long echo_step_us = 1000;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_help();
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "dsinfer serve: %s needs a value (see --help)\n", arg.c_str());
      return 2;
    }
    const char* value = argv[++i];
    long long n = 0;
    auto need_int = [&](long long lo, long long hi) {
      if (parse_int(value, lo, hi, n)) return true;
      std::fprintf(stderr, "dsinfer serve: %s expects an integer in [%lld, %lld], got '%s'\n", arg.c_str(), lo, hi, value);
      return false;
    };
    if (arg == "--model") model_dir = value;
    else if (arg == "--host") http_options.host = value;
    else if (arg == "--port") { if (!need_int(0, 65535)) return 2; http_options.port = static_cast<int>(n); }
    else if (arg == "--api-key") api_options.api_key = value;
    else if (arg == "--served-model-name") api_options.served_model_name = value;
    else if (arg == "--max-queued") { if (!need_int(1, 1 << 30)) return 2; api_options.max_queued = static_cast<int>(n); }
    else if (arg == "--max-body-bytes") { if (!need_int(1024, 1ll << 32)) return 2; http_options.max_body_bytes = static_cast<size_t>(n); }
    else if (arg == "--backend") backend = value;
    else if (arg == "--grace-period-s") { if (!need_int(0, 86400)) return 2; grace_period_s = n; }
    else if (arg == "--engine") engine_kind = value;
    else if (arg == "--max-context-tokens") { if (!need_int(16, 1 << 24)) return 2; max_context_tokens = n; }
    else if (arg == "--echo-step-us") { if (!need_int(0, 10000000)) return 2; echo_step_us = n; }
    else {
      std::fprintf(stderr, "dsinfer serve: unknown option '%s' (see --help)\n", arg.c_str());
      return 2;
    }
  }
  if (engine_kind != "model" && engine_kind != "echo") {
    std::fprintf(stderr, "dsinfer serve: --engine must be 'model' or 'echo'\n");
    return 2;
  }
  if (backend != "cpu" && backend != "cuda") {
    std::fprintf(stderr, "dsinfer serve: --backend must be 'cpu' or 'cuda'\n");
    return 2;
  }
  if (api_options.served_model_name.empty()) {
    api_options.served_model_name =
        engine_kind == "echo" ? "echo" : std::filesystem::path(model_dir).filename().string();
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
  if (engine_kind == "echo") {
    dsinfer::server::EchoEngineOptions options;
    options.max_context_tokens = static_cast<int>(max_context_tokens);
    options.step_interval_us = static_cast<int>(echo_step_us);
    options.max_running = 4096;
    auto e = std::make_unique<dsinfer::server::EchoEngine>(options);
    echo = e.get();
    engine = std::move(e);
    model_codec = std::make_unique<dsinfer::server::ByteCodec>();
  } else {
    std::fprintf(stderr,
                 "dsinfer serve: serving a model needs the engine core, which this build does not include yet; "
                 "use --engine echo to run the server alone\n");
    http.stop();
    io_thread.join();
    return 1;
  }
  api.set_model(engine.get(), model_codec.get());
  std::fprintf(stderr, "dsinfer serve: ready\n");
  std::fflush(stderr);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::fprintf(stderr, "dsinfer serve: %s: draining (grace period %llds)\n", strsignal(signal_number), grace_period_s);
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
  std::fprintf(stderr, "dsinfer serve: stopped\n");
  return 0;
}

}  // namespace

DSINFER_REGISTER_COMMAND(serve, "serve", "serve the model over HTTP (OpenAI and Anthropic APIs)", run_serve);
