// When each kernel of a recorded step starts and finishes waiting for the kernels before it:
// where a step's time goes with overlapped launches and recorded graphs, which a profiler that
// runs kernels one at a time cannot show. A build option (-DDSINFER_KERNEL_TIMELINE=ON), since
// it adds a clock read and an atomic to one thread of every kernel; the environment variable
// DSINFER_KERNEL_TIMELINE=<file> then makes the backend write the last replayed step's kernels
// to <file> when it is destroyed (tools/kernel_timeline.py sums them up).
//
// On the device, the first block of every kernel reads the global timer when it reaches
// await_previous_kernels() ("entered": the kernel's blocks are running) and again when the
// wait returns ("resumed": every kernel before it has finished), and appends both with its
// grid to the timeline's slots. A kernel whose first block does work of its own (the routing
// beside a product) may also note when that block is done ("first_block_done"). On the host,
// every launch made while a step is recorded is logged with its kernel's name, grid and stream;
// the writer pairs the device's entries with those launches by grid, keeping each stream's
// order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dsinfer::cuda {

#ifdef DSINFER_KERNEL_TIMELINE
inline constexpr bool kKernelTimelineBuilt = true;
#else
inline constexpr bool kKernelTimelineBuilt = false;
#endif

// Whether this build has the timeline (for code outside the backend's library).
bool kernel_timeline_built();

// Slots: [0] entries written, [1] capacity, then kKernelTimelineWords per entry.
inline constexpr int kKernelTimelineHeaderWords = 2;
// entered ns, resumed ns, grid x, grid y | z << 32, and the ns at which the first block said it
// was done (note_first_block_done; 0 where the kernel does not say)
inline constexpr int kKernelTimelineWords = 5;

// Every translation unit with kernels registers how to point its copy of the slots pointer at
// the timeline (a __device__ variable is private to its translation unit).
using KernelTimelineSetter = void (*)(unsigned long long* slots);
bool register_kernel_timeline_setter(KernelTimelineSetter setter);

// A launch as the host made it.
struct KernelLaunch {
  const void* kernel = nullptr;
  dim3 grid;
  cudaStream_t stream = nullptr;
};

// Called by every launch of the backend's kernels; kept only while a log is open.
void log_kernel_launch(const void* kernel, dim3 grid, cudaStream_t stream);

class KernelTimeline {
 public:
  // Points every translation unit's kernels at new slots for max_entries kernels.
  KernelTimeline(std::string path, int max_entries);
  ~KernelTimeline();
  KernelTimeline(const KernelTimeline&) = delete;
  KernelTimeline& operator=(const KernelTimeline&) = delete;

  // The launches made between the two calls (a step being recorded).
  void open_log();
  std::vector<KernelLaunch> close_log();

  // Empties the slots before a replay, in stream order.
  void clear(cudaStream_t stream);
  // Waits for the device, pairs its entries with `launches` and writes them to the file, one
  // line per kernel: order, stream ("main" if it is main_stream), grid, entered and resumed
  // in µs from the first kernel's entry, and the kernel's name.
  void write(const std::vector<KernelLaunch>& launches, cudaStream_t main_stream) const;

 private:
  std::string path_;
  int max_entries_ = 0;
  unsigned long long* slots_ = nullptr;  // device
};

// The timeline the backend keeps when the build has it and DSINFER_KERNEL_TIMELINE names a
// file; null otherwise.
std::unique_ptr<KernelTimeline> kernel_timeline_from_env();

}  // namespace dsinfer::cuda
