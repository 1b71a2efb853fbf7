#include "core/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/check.h"

namespace dsinfer {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("DSINFER_LOG");
  if (env == nullptr) return LogLevel::kInfo;
  if (!std::strcmp(env, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(env, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(env, "error")) return LogLevel::kError;
  if (!std::strcmp(env, "off")) return LogLevel::kOff;
  return LogLevel::kInfo;
}

std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}

std::mutex& log_mutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

LogLevel log_level() { return level_ref().load(std::memory_order_relaxed); }
void set_log_level(LogLevel level) { level_ref().store(level); }

void log_message(LogLevel level, const std::string& message) {
  static const char* kNames[] = {"D", "I", "W", "E", "-"};
  using namespace std::chrono;
  const auto now = duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(log_mutex());
  std::fprintf(stderr, "[%s %lld.%03lld] %s\n", kNames[static_cast<int>(level)],
               static_cast<long long>(now / 1000 % 100000), static_cast<long long>(now % 1000),
               message.c_str());
}

namespace detail {
void check_failed(const char* file, int line, const char* expr, const std::string& msg) {
  std::fprintf(stderr, "CHECK failed at %s:%d: %s %s\n", file, line, expr, msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace dsinfer
