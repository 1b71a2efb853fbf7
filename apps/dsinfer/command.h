// The subcommand registry of the dsinfer binary. Each cmd_*.cpp registers one subcommand.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace dsinfer::cli {

// argv[0] is the subcommand's name; returns the process exit code.
using CommandFn = std::function<int(int argc, char** argv)>;

struct Command {
  std::string name;
  std::string summary;
  CommandFn run;
};

std::vector<Command>& command_registry();

struct CommandRegistration {
  CommandRegistration(std::string name, std::string summary, CommandFn run) {
    command_registry().push_back({std::move(name), std::move(summary), std::move(run)});
  }
};

// Default model directory: models/demo beside the binary's source tree, or $DSINFER_MODEL.
std::string default_model_dir();

}  // namespace dsinfer::cli

#define DSINFER_REGISTER_COMMAND(ident, name, summary, fn) \
  static ::dsinfer::cli::CommandRegistration ident##_registration(name, summary, fn)
