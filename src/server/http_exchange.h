// One HTTP request and the channel to answer it, without any Boost types, so that routing and
// sessions are plain C++ (and testable with a fake exchange). HttpServer (http_server.h)
// implements it over Beast; tests implement it in memory.
//
// Threading: the server runs one I/O thread. Handlers and every HttpExchange method except
// post() run on it; post() is safe from any thread (engine callbacks use it to get back).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsinfer::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query, as sent
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  bool body_too_large = false;  // the body exceeded the limit and was not read (→ 413)

  std::string path() const;  // target without the query string
  // First header with this name (case-insensitive), or "".
  std::string header(std::string_view name) const;
};

class HttpExchange {
 public:
  virtual ~HttpExchange() = default;

  // A complete response (Content-Length framing).
  virtual void respond(int status, std::string_view content_type, std::string body,
                       std::vector<std::pair<std::string, std::string>> extra_headers = {}) = 0;

  // A streamed response (chunked framing): start once, write any number of times, end once.
  virtual void start_stream(int status, std::string_view content_type) = 0;
  // Queues `data`; false when the connection is gone or its unsent bytes would pass the
  // per-connection limit, in which case the connection is closed (a client that does not read
  // must not hold server memory) and on_close fires.
  virtual bool write(std::string data) = 0;
  virtual void end_stream() = 0;

  // Called once, on the I/O thread, if the connection closes before the response ended.
  virtual void set_on_close(std::function<void()> on_close) = 0;
  virtual bool closed() const = 0;

  // Runs `fn` on the I/O thread (from any thread). Dropped if the server has stopped.
  virtual void post(std::function<void()> fn) = 0;
};

using RequestHandler = std::function<void(HttpRequest request, std::shared_ptr<HttpExchange> exchange)>;

}  // namespace dsinfer::server
