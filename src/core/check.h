// Invariant checks: a broken invariant logs file:line and aborts. Never for bad user input.
#pragma once

#include <sstream>

namespace dsinfer::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& msg);
}  // namespace dsinfer::detail

#define DS_CHECK(cond)                                                          \
  do {                                                                          \
    if (!(cond)) [[unlikely]]                                                   \
      ::dsinfer::detail::check_failed(__FILE__, __LINE__, #cond, std::string()); \
  } while (0)

#define DS_CHECK_MSG(cond, msg)                                            \
  do {                                                                     \
    if (!(cond)) [[unlikely]] {                                            \
      std::ostringstream ds_check_os_;                                     \
      ds_check_os_ << msg;                                                 \
      ::dsinfer::detail::check_failed(__FILE__, __LINE__, #cond, ds_check_os_.str()); \
    }                                                                      \
  } while (0)
