// Status and Result<T>: how a request's bad input travels back to the boundary that reports it.
// Loading code throws dsinfer::Error inside its module instead and converts at load_model().
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace dsinfer {

enum class StatusCode {
  kOk,
  kInvalidArgument,    // the caller's input is wrong (HTTP 400)
  kNotFound,           // a named thing does not exist (HTTP 404)
  kOutOfRange,         // e.g. prompt + max tokens over the context (HTTP 400)
  kResourceExhausted,  // queue full, out of memory (HTTP 429)
  kUnavailable,        // shutting down, not ready (HTTP 503)
  kPermissionDenied,   // bad API key (HTTP 401)
  kCancelled,
  kDataLoss,           // corrupt or truncated files
  kUnimplemented,
  kInternal,
};

const char* status_code_name(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// The exception thrown inside loading modules; carries a code so the boundary can map it.
class Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  explicit Error(const std::string& message) : Error(StatusCode::kInvalidArgument, message) {}
  StatusCode code() const { return code_; }
  Status status() const { return Status(code_, what()); }

 private:
  StatusCode code_;
};

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : value_(std::move(status)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(value_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(value_);
  }
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace dsinfer
