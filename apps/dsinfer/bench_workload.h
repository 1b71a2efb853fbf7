// `dsinfer bench --workload NUMxINxOUT`: an offline workload through the real engine
// (EngineCore: scheduler, KV cache manager, model runner, sampler), as `dsinfer generate` runs it.
// NUM requests are submitted at once, each with IN random prompt tokens, each generating exactly
// OUT tokens (greedy, eos ignored); the run reports throughput and time to first token. One
// warm-up request of the same prompt length runs first, off the clock.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "engine/engine_config.h"

namespace dsinfer::cli {

struct WorkloadShape {
  int num_requests = 0;
  int prompt_len_tokens = 0;
  int output_len_tokens = 0;
};

// Parses "NUMxINxOUT" (e.g. "200x1000x100"); each field a positive integer.
Result<WorkloadShape> parse_workload_shape(const std::string& text);

struct WorkloadOptions {
  EngineConfig engine;     // model, backend, scheduler limits
  bool kv_size_given = false;  // else the KV cache is sized to hold every running request at full length
  WorkloadShape shape;
  uint64_t prompt_seed = 0;
  std::string results_path;  // append a section here when not empty
  std::string command;       // the command line, for the results section
  std::string machine;       // machine label for the results section
};

// Runs the workload, prints its section to stdout and returns the process exit code: 1 when the
// engine cannot be built, a request is rejected, or any request ends with other than exactly OUT
// tokens (each such request is named on stderr).
int run_workload(WorkloadOptions options);

}  // namespace dsinfer::cli
