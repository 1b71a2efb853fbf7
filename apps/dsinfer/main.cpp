// dsinfer: one binary, several subcommands (serve, generate, tokenize, bench, ...).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "command.h"

namespace dsinfer::cli {

std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

std::string default_model_dir() {
  if (const char* env = std::getenv("DSINFER_MODEL")) return env;
  // The binary lives in <repo>/build/; the demo model in <repo>/models/demo.
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (auto dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
      if (std::filesystem::exists(dir / "models/demo/config.json")) return (dir / "models/demo").string();
    }
  }
  return "models/demo";
}

}  // namespace dsinfer::cli

static void print_usage() {
  auto commands = dsinfer::cli::command_registry();
  std::sort(commands.begin(), commands.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::fprintf(stderr, "usage: dsinfer <command> [options]\n\ncommands:\n");
  for (const auto& c : commands) std::fprintf(stderr, "  %-12s %s\n", c.name.c_str(), c.summary.c_str());
  std::fprintf(stderr, "\nRun 'dsinfer <command> --help' for a command's options.\n");
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : dsinfer::cli::command_registry()) {
    if (c.name == argv[1]) {
      try {
        return c.run(argc - 1, argv + 1);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "dsinfer %s: error: %s\n", argv[1], e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "dsinfer: unknown command '%s'\n\n", argv[1]);
  print_usage();
  return 2;
}
