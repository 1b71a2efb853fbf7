// Command-line options shared by the subcommands that build an engine (generate, serve, bench).
#pragma once

#include <CLI/CLI.hpp>

#include "engine/engine_config.h"

namespace dsinfer::cli {

struct EngineOptions {
  EngineConfig config;
  int64_t kv_cache_mb = 0;  // 0: by backend (cuda: gpu_memory_utilization; cpu: 1 GiB)
  double gpu_memory_utilization = 0.9;
  std::string kv_cache_dtype = "fp32";
  std::string precision = "default";
  // Scheduling one step ahead: -1 by backend (on for cuda), 0 off, 1 on.
  int async_scheduling = -1;
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
// --async-scheduling / --no-async-scheduling into `choice` (-1 when neither is given).
void add_async_scheduling_options(CLI::App& app, int& choice, const std::string& scope);
// Whether an engine on `backend` schedules one step ahead: the choice, or by default on the
// CUDA backend, whose device would otherwise wait on the host between steps.
bool async_scheduling_for(int choice, const std::string& backend);
// Fills in defaults after parsing (model dir, KV bytes).
EngineConfig finish_engine_options(EngineOptions& options);

}  // namespace dsinfer::cli
