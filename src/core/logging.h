// Minimal leveled logging to stderr. Level from DSINFER_LOG (debug|info|warn|error|off).
#pragma once

#include <sstream>
#include <string>

namespace dsinfer {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_message(LogLevel level, const std::string& message);

}  // namespace dsinfer

#define DS_LOG(level, msg)                                        \
  do {                                                            \
    if (::dsinfer::LogLevel::level >= ::dsinfer::log_level()) {   \
      std::ostringstream ds_log_os_;                              \
      ds_log_os_ << msg;                                          \
      ::dsinfer::log_message(::dsinfer::LogLevel::level, ds_log_os_.str()); \
    }                                                             \
  } while (0)
#define DS_LOG_DEBUG(msg) DS_LOG(kDebug, msg)
#define DS_LOG_INFO(msg) DS_LOG(kInfo, msg)
#define DS_LOG_WARN(msg) DS_LOG(kWarn, msg)
#define DS_LOG_ERROR(msg) DS_LOG(kError, msg)
