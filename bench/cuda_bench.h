// What the CUDA micro-benchmarks share: the device they run on, timing a recorded graph's
// replays, and the date and file their markdown tables go to.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

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

#ifdef __CUDACC__
constexpr int kChainGroupThreads = 128;  // threads of a group that runs a chain step
constexpr int kChainWidth = 2048;        // floats a chain step reads and writes

// The block's own barrier, for chain steps whose groups make up the whole block.
struct BlockBarrier {
  __device__ void operator()() const { __syncthreads(); }
};

// One chain step (bench_launch_chain, bench_chain_and_stream) of group `group` of `num_groups`:
// the sum of squares of the whole input, then this group's slice of the output, normalised by
// it. A block holds kGroups groups of kChainGroupThreads threads; barrier() meets the threads
// that run the step. The input comes from L2 (another block, or the kernel before, wrote it).
template <int kGroups, typename Barrier>
__device__ void chain_step(const float* in, float* out, int group, int num_groups, Barrier barrier) {
  __shared__ float warp_sums[kGroups][kChainGroupThreads / 32];
  const int sub = threadIdx.x / kChainGroupThreads, tid = threadIdx.x % kChainGroupThreads;
  float sum = 0.0f;
  for (int i = tid; i < kChainWidth; i += kChainGroupThreads) {
    const float v = __ldcg(in + i);
    sum = fmaf(v, v, sum);
  }
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (tid % 32 == 0) warp_sums[sub][tid / 32] = sum;
  barrier();
  float total = 0.0f;
  for (int w = 0; w < kChainGroupThreads / 32; ++w) total += warp_sums[sub][w];
  const float inv = rsqrtf(total / kChainWidth + 1e-6f);
  const int slice = (kChainWidth + num_groups - 1) / num_groups;
  for (int i = group * slice + tid; i < min(kChainWidth, (group + 1) * slice); i += kChainGroupThreads)
    __stcg(out + i, __ldcg(in + i) * inv);
  barrier();  // warp_sums is reused by the next step
}

// Polls a counter (or a flag) until it reaches `target` (the calling thread's acquire).
__device__ __forceinline__ void poll_until(const unsigned* counter, unsigned target) {
  unsigned seen = 0;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen < target);
}

// The grid-wide barrier of the chain benches' persistent kernels: every block arrives once at
// the counter (its thread 0, after barrier() has met the block's chain threads), and goes on
// once `target` arrivals are in.
template <typename Barrier>
__device__ void grid_barrier(unsigned* arrived, unsigned target, Barrier barrier) {
  barrier();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(arrived, 1u);
    poll_until(arrived, target);
  }
  barrier();
}
#endif

// The options of the chain benches (bench_launch_chain, bench_chain_and_stream).
struct ChainOptions {
  int num_steps = 130;
  int num_replays = 200;
  std::string append_path;  // where the results table is appended; empty: nowhere
};

// Reads --steps N, --replays N and --append FILE into options, whose fields hold the defaults;
// false, with the usage on stderr, for any other argument.
inline bool parse_chain_options(int argc, char** argv, ChainOptions& options) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next_int = [&](int& v) {
      if (i + 1 < argc) v = std::max(1, std::atoi(argv[++i]));
    };
    if (a == "--steps") next_int(options.num_steps);
    else if (a == "--replays") next_int(options.num_replays);
    else if (a == "--append" && i + 1 < argc) options.append_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--steps N] [--replays N] [--append FILE]\n", argv[0]);
      return false;
    }
  }
  return true;
}

// The mean square of the n floats at device address v: a chain of normalising steps that ran
// leaves 1.
inline double device_mean_square(const float* v, int n) {
  std::vector<float> host(n);
  DS_CUDA_CHECK(cudaMemcpy(host.data(), v, n * sizeof(float), cudaMemcpyDeviceToHost));
  double sum = 0;
  for (float x : host) sum += static_cast<double>(x) * x;
  return sum / n;
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
