// Command-line options shared by the subcommands that build an engine (generate, serve, bench).
#pragma once

#include <CLI/CLI.hpp>

#include "engine/engine_config.h"

namespace dsinfer::cli {

struct EngineOptions {
  EngineConfig config;
  int64_t kv_cache_mb = 1024;
};

void add_engine_options(CLI::App& app, EngineOptions& options);
// Fills in defaults after parsing (model dir, KV bytes).
EngineConfig finish_engine_options(EngineOptions& options);

}  // namespace dsinfer::cli
