// What the CUDA micro-benchmarks share: the device they run on, timing a recorded graph's
// replays, and the date and file their markdown tables go to.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "backend/cuda/cuda_check.h"

namespace dsinfer::bench {

// The first CUDA device's properties into prop; false, with a line naming `program` on stderr,
// where there is none.
inline bool first_device(const char* program, cudaDeviceProp& prop) {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "%s: no CUDA device\n", program);
    return false;
  }
  DS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return true;
}

// Milliseconds a replay takes of the graph that `record` captures on `stream`: replayed
// num_warmups times untimed, then num_replays times between two events.
inline double graph_replay_ms(const std::function<void(cudaStream_t)>& record, int num_warmups, int num_replays,
                              cudaStream_t stream) {
  cudaGraph_t graph;
  DS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  record(stream);
  DS_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  DS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < num_warmups; ++i) DS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t start, stop;
  DS_CUDA_CHECK(cudaEventCreate(&start));
  DS_CUDA_CHECK(cudaEventCreate(&stop));
  DS_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < num_replays; ++i) DS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  DS_CUDA_CHECK(cudaEventRecord(stop, stream));
  DS_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  DS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  DS_CUDA_CHECK(cudaEventDestroy(start));
  DS_CUDA_CHECK(cudaEventDestroy(stop));
  DS_CUDA_CHECK(cudaGraphExecDestroy(exec));
  DS_CUDA_CHECK(cudaGraphDestroy(graph));
  return static_cast<double>(ms) / num_replays;
}

// Today's date (UTC) as YYYY-MM-DD, for a results section's title.
inline std::string utc_date() {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  return date;
}

// Appends a results section to `path` (a new file starts with the results file's title).
inline void append_results(const std::string& path, const std::string& text) {
  const bool exists = std::filesystem::exists(path);
  std::ofstream f(path, std::ios::app);
  if (!exists) f << "# dsinfer benchmark results\n";
  f << text;
}

}  // namespace dsinfer::bench
