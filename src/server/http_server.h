// The event-driven HTTP/1.1 server (Boost.Beast over Asio, kept inside http_server.cpp): one
// I/O thread, any number of keep-alive connections, no thread per connection. Requests are
// parsed with a body limit (over it: the handler gets body_too_large and the connection closes
// after the answer); responses go out through HttpExchange with a bounded write queue per
// connection; a peer that goes away while a response is pending fires the exchange's on_close.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "server/http_exchange.h"

namespace dsinfer::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0 picks a free port (see port())
  size_t max_body_bytes = 8u << 20;
  size_t max_header_bytes = 64u << 10;
  size_t max_pending_write_bytes = 4u << 20;  // per connection; past it the client is dropped
  int idle_timeout_s = 300;  // keep-alive connections idle this long are closed
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, RequestHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens; errors (address in use, bad host) come back as a Status.
  Status listen();
  int port() const;  // the bound port

  // Runs the I/O loop on the calling thread until stop().
  void run();
  // Stops accepting connections; open ones continue (thread-safe).
  void stop_accepting();
  // Closes everything and makes run() return (thread-safe).
  void stop();
  // Runs `fn` on the I/O thread (thread-safe).
  void post(std::function<void()> fn);

  int num_open_connections() const;

  struct Impl;  // defined in http_server.cpp (Beast stays there)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace dsinfer::server
