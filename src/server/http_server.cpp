// HttpServer over Boost.Beast. The only translation unit that includes Beast/Asio for serving.
//
// Per connection: read a request with Beast's parser (body and header limits), hand it to the
// handler, and while the answer is pending keep one small read outstanding so a peer that hangs
// up is noticed at once (its bytes, if it pipelines, stay in the buffer for the next parse).
// Responses are framed by hand (Content-Length or chunked) into a bounded write queue that is
// flushed with gathered writes.
#include "server/http_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <optional>

#include "core/logging.h"

namespace dsinfer::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

constexpr size_t kWatchReadBytes = 4096;
constexpr size_t kMaxDrainBytes = 64u << 20;     // what a rejected oversized body may still send

}  // namespace

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  HttpServerOptions options;
  RequestHandler handler;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  std::atomic<int> num_connections{0};
  std::atomic<bool> accepting{true};

  void accept();
};

class Connection;

class ConnectionExchange : public HttpExchange {
 public:
  ConnectionExchange(std::shared_ptr<Connection> connection, std::shared_ptr<HttpServer::Impl> server, uint64_t seq)
      : connection_(std::move(connection)), server_(std::move(server)), seq_(seq) {}
  void respond(int status, std::string_view content_type, std::string body,
               std::vector<std::pair<std::string, std::string>> extra_headers) override;
  void start_stream(int status, std::string_view content_type) override;
  bool write(std::string data) override;
  void end_stream() override;
  void set_on_close(std::function<void()> on_close) override;
  bool closed() const override;
  void post(std::function<void()> fn) override { asio::post(server_->io, std::move(fn)); }

 private:
  std::shared_ptr<Connection> connection_;
  std::shared_ptr<HttpServer::Impl> server_;
  uint64_t seq_;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, std::shared_ptr<HttpServer::Impl> server)
      : socket_(std::move(socket)), server_(std::move(server)), idle_timer_(server_->io) {
    ++server_->num_connections;
  }
  ~Connection() { --server_->num_connections; }

  void start() { read_request(); }

  // ---- used by ConnectionExchange (I/O thread) ----
  bool current(uint64_t seq) const { return !closed_ && responding_ && seq == seq_; }
  bool is_closed() const { return closed_; }

  void respond(uint64_t seq, int status, std::string_view content_type, std::string body,
               const std::vector<std::pair<std::string, std::string>>& extra) {
    if (!current(seq) || started_) return;
    std::string head = status_line(status);
    head += "Content-Type: ";
    head += content_type;
    head += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    for (const auto& [k, v] : extra) head += k + ": " + v + "\r\n";
    head += "\r\n";
    head += body;
    enqueue(std::move(head), /*force=*/true);
    finish_response();
  }

  void start_stream(uint64_t seq, int status, std::string_view content_type) {
    if (!current(seq) || started_) return;
    started_ = true;
    std::string head = status_line(status);
    head += "Content-Type: ";
    head += content_type;
    head += "\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n\r\n";
    enqueue(std::move(head), /*force=*/true);
  }

  bool write_chunk(uint64_t seq, std::string data) {
    if (!current(seq) || !started_) return false;
    if (data.empty()) return true;
    char size_line[24];
    int n = std::snprintf(size_line, sizeof(size_line), "%zx\r\n", data.size());
    data.insert(0, size_line, static_cast<size_t>(n));
    data += "\r\n";
    return enqueue(std::move(data), /*force=*/false);
  }

  void end_stream(uint64_t seq) {
    if (!current(seq) || !started_) return;
    enqueue("0\r\n\r\n", /*force=*/true);
    finish_response();
  }

  void set_on_close(uint64_t seq, std::function<void()> fn) {
    if (current(seq)) on_close_ = std::move(fn);
  }

 private:
  std::string status_line(int status) const {
    std::string s = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
    s += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    return s;
  }

  void arm_idle_timer() {
    idle_timer_.expires_after(std::chrono::seconds(server_->options.idle_timeout_s));
    idle_timer_.async_wait([weak = weak_from_this()](beast::error_code ec) {
      auto self = weak.lock();
      if (!ec && self && !self->responding_) self->close();
    });
  }

  void read_request() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(server_->options.max_body_bytes);
    parser_->header_limit(static_cast<uint32_t>(server_->options.max_header_bytes));
    arm_idle_timer();
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_request(ec); });
  }

  void on_request(beast::error_code ec) {
    if (closed_) return;
    HttpRequest request;
    if (ec == http::error::body_limit) {
      request.body_too_large = true;
    } else if (ec) {
      bool bad_http = ec.category() == http::make_error_code(http::error::bad_target).category() &&
                      ec != http::error::end_of_stream && ec != http::error::partial_message;
      if (bad_http) {
        // Not HTTP we can read: answer once in OpenAI's error shape and hang up.
        keep_alive_ = false;
        responding_ = true;
        ++seq_;
        respond(seq_, 400, "application/json",
                R"({"error":{"message":"malformed HTTP request","type":"invalid_request_error","param":null,"code":null}})", {});
        return;
      }
      close();
      return;
    }
    auto& msg = parser_->get();
    request.method = std::string(msg.method_string());
    request.target = std::string(msg.target());
    for (const auto& field : msg) request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    if (!request.body_too_large) request.body = std::move(msg.body());
    keep_alive_ = !request.body_too_large && msg.keep_alive();
    parser_.reset();
    idle_timer_.cancel();
    responding_ = true;
    started_ = false;
    ++seq_;
    // With a pipelined request already buffered the client is plainly there, and the next parse
    // must not wait behind a watch read.
    if (!request.body_too_large && buffer_.size() == 0) watch();
    auto exchange = std::make_shared<ConnectionExchange>(shared_from_this(), server_, seq_);
    server_->handler(std::move(request), std::move(exchange));
  }

  // One small read while a response is pending: EOF or an error means the client left.
  void watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    socket_.async_read_some(buffer_.prepare(kWatchReadBytes), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->watching_ = false;
      if (self->closed_) return;
      if (ec) {
        self->close();
        return;
      }
      self->buffer_.commit(n);
      // Bytes while a response is pending are a pipelined request: keep them for the next
      // parse (after_flush starts it) and stop watching, the client is evidently there.
      if (self->responding_) return;
      if (self->draining_) self->drain();
      else if (!self->writing_ && self->keep_alive_) self->read_request();
    });
  }

  void finish_response() {
    responding_ = false;
    on_close_ = nullptr;
    if (keep_alive_) arm_idle_timer();  // an idle keep-alive connection is closed in time
    if (!writing_) after_flush();
  }

  void after_flush() {
    if (responding_ || closed_) return;
    if (!keep_alive_) {
      graceful_close();
      return;
    }
    if (!watching_) read_request();
  }

  bool enqueue(std::string data, bool force) {
    if (closed_) return false;
    if (!force && queued_bytes_ + data.size() > server_->options.max_pending_write_bytes) {
      DS_LOG_DEBUG("http: dropping a client that is not reading (" << queued_bytes_ << " bytes unsent)");
      close();
      return false;
    }
    queued_bytes_ += data.size();
    queue_.push_back(std::move(data));
    if (!writing_) flush();
    return true;
  }

  void flush() {
    writing_ = true;
    in_flight_.clear();
    while (!queue_.empty()) {
      in_flight_.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    buffers_.clear();
    for (const auto& s : in_flight_) buffers_.emplace_back(s.data(), s.size());
    asio::async_write(socket_, buffers_, [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->writing_ = false;
      self->queued_bytes_ -= std::min(self->queued_bytes_, n);
      if (ec) {
        self->close();
        return;
      }
      if (!self->queue_.empty()) self->flush();
      else if (!self->responding_) self->after_flush();
    });
  }

  // After a Connection: close answer: stop sending, swallow what the client still sends (a
  // rejected oversized body) so it reads our answer instead of a reset, then close.
  void graceful_close() {
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    drain_bytes_ = 0;
    draining_ = true;
    idle_timer_.expires_after(std::chrono::seconds(5));
    idle_timer_.async_wait([weak = weak_from_this()](beast::error_code ec) {
      if (auto self = weak.lock(); self && !ec) self->close();
    });
    if (!watching_) drain();  // else the pending watch read continues into drain()
  }

  void drain() {
    buffer_.consume(buffer_.size());
    socket_.async_read_some(buffer_.prepare(64 * 1024), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->drain_bytes_ += n;
      if (ec || self->drain_bytes_ > kMaxDrainBytes) {
        self->close();
        return;
      }
      self->buffer_.commit(n);
      self->drain();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    idle_timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    queue_.clear();
    if (responding_) {
      responding_ = false;
      if (auto fn = std::move(on_close_)) fn();
    }
    on_close_ = nullptr;
  }

  tcp::socket socket_;
  std::shared_ptr<HttpServer::Impl> server_;
  asio::steady_timer idle_timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> queue_;
  std::vector<std::string> in_flight_;
  std::vector<asio::const_buffer> buffers_;
  size_t queued_bytes_ = 0;
  size_t drain_bytes_ = 0;
  uint64_t seq_ = 0;
  bool writing_ = false;
  bool watching_ = false;
  bool responding_ = false;
  bool started_ = false;
  bool keep_alive_ = true;
  bool closed_ = false;
  bool draining_ = false;
  std::function<void()> on_close_;
};

void ConnectionExchange::respond(int status, std::string_view content_type, std::string body,
                                 std::vector<std::pair<std::string, std::string>> extra_headers) {
  connection_->respond(seq_, status, content_type, std::move(body), extra_headers);
}
void ConnectionExchange::start_stream(int status, std::string_view content_type) {
  connection_->start_stream(seq_, status, content_type);
}
bool ConnectionExchange::write(std::string data) { return connection_->write_chunk(seq_, std::move(data)); }
void ConnectionExchange::end_stream() { connection_->end_stream(seq_); }
void ConnectionExchange::set_on_close(std::function<void()> on_close) { connection_->set_on_close(seq_, std::move(on_close)); }
bool ConnectionExchange::closed() const { return !connection_->current(seq_); }

void HttpServer::Impl::accept() {
  if (!accepting) return;
  acceptor.async_accept(io, [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !self->accepting) return;
    if (ec) {
      // Out of file descriptors and the like: back off briefly instead of spinning.
      DS_LOG_WARN("http: accept failed: " << ec.message());
      self->accept_retry.expires_after(std::chrono::milliseconds(50));
      self->accept_retry.async_wait([self](beast::error_code) { self->accept(); });
      return;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    std::make_shared<Connection>(std::move(socket), self)->start();
    self->accept();
  });
}

HttpServer::HttpServer(HttpServerOptions options, RequestHandler handler) : impl_(std::make_shared<Impl>()) {
  impl_->options = std::move(options);
  impl_->handler = std::move(handler);
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::listen() {
  beast::error_code ec;
  auto address = asio::ip::make_address(impl_->options.host, ec);
  if (ec) return Status(StatusCode::kInvalidArgument, "bad --host '" + impl_->options.host + "': " + ec.message());
  tcp::endpoint endpoint(address, static_cast<unsigned short>(impl_->options.port));
  auto& acceptor = impl_->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status(StatusCode::kUnavailable, "cannot listen on " + impl_->options.host + ":" +
                                                std::to_string(impl_->options.port) + ": " + ec.message());
  }
  impl_->accept();
  return Status();
}

int HttpServer::port() const {
  beast::error_code ec;
  auto endpoint = impl_->acceptor.local_endpoint(ec);
  return ec ? -1 : endpoint.port();
}

void HttpServer::run() {
  auto guard = asio::make_work_guard(impl_->io);
  impl_->io.run();
}

void HttpServer::stop_accepting() {
  asio::post(impl_->io, [impl = impl_] {
    impl->accepting = false;
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->accept_retry.cancel();
  });
}

void HttpServer::stop() { impl_->io.stop(); }

void HttpServer::post(std::function<void()> fn) { asio::post(impl_->io, std::move(fn)); }

int HttpServer::num_open_connections() const { return impl_->num_connections.load(); }

}  // namespace dsinfer::server
