// Command-line options shared by the subcommands that build an engine (generate, serve, bench).
#pragma once

#include <CLI/CLI.hpp>

#include "engine/engine_config.h"

namespace dsinfer::cli {

struct EngineOptions {
  EngineConfig config;
  int64_t kv_cache_mb = 1024;
  std::string kv_cache_dtype = "fp32";
  std::string precision = "default";
  // KV tiers. The block store is on when --kv-store is given, or by default where a
  // subcommand sets kv_store_by_default (serve), unless --no-kv-store.
  bool kv_store_by_default = false;
  std::string kv_store_dir;
  bool no_kv_store = false;
  std::string kv_store_capacity;
  std::string kv_host_cache;
  std::string kv_ttl_agent;
  std::string kv_ttl_chat;
};

void add_engine_options(CLI::App& app, EngineOptions& options);
// Fills in defaults after parsing (model dir, KV bytes).
EngineConfig finish_engine_options(EngineOptions& options);

}  // namespace dsinfer::cli
