// Runs the dsinfer binary (or another command) as a user would, for tests: exit code plus stdout
// and stderr together.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace dsinfer::testing {

struct RunResult {
  int exit_code = -1;  // -1 when the process did not exit normally (a crash)
  std::string out;
};

// Runs `command` through the shell, stderr folded into stdout.
inline RunResult run_command(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  RunResult r;
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `args` is appended to the binary's path and run through the shell.
inline RunResult run_dsinfer(const std::string& args) { return run_command(std::string(DSINFER_BINARY) + " " + args); }

// Runs the source tree's tools/<script> with python3 and `args`.
inline RunResult run_tool(const std::string& script, const std::string& args) {
  return run_command("python3 " + std::string(DSINFER_SOURCE_DIR) + "/tools/" + script + " " + args);
}

}  // namespace dsinfer::testing
