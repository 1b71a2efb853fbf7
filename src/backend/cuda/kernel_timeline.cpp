#include "backend/cuda/kernel_timeline.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iomanip>
#include <mutex>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "core/check.h"
#include "core/logging.h"

namespace dsinfer::cuda {
namespace {

struct LaunchLog {
  std::mutex mutex;
  bool open = false;
  std::vector<KernelLaunch> launches;
};

LaunchLog& launch_log() {
  static LaunchLog log;
  return log;
}

std::vector<KernelTimelineSetter>& setters() {
  static std::vector<KernelTimelineSetter> all;
  return all;
}

// The kernel's name, demangled where it can be.
std::string kernel_name(const void* kernel) {
  const char* mangled = nullptr;
  if (cudaFuncGetName(&mangled, kernel) != cudaSuccess || mangled == nullptr) {
    cudaGetLastError();
    return "?";
  }
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : mangled;
  std::free(demangled);
  return name;
}

}  // namespace

bool kernel_timeline_built() { return kKernelTimelineBuilt; }

bool register_kernel_timeline_setter(KernelTimelineSetter setter) {
  setters().push_back(setter);
  return true;
}

void log_kernel_launch(const void* kernel, dim3 grid, cudaStream_t stream) {
  LaunchLog& log = launch_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  if (log.open) log.launches.push_back({kernel, grid, stream});
}

KernelTimeline::KernelTimeline(std::string path, int max_entries) : path_(std::move(path)), max_entries_(max_entries) {
  const size_t words = kKernelTimelineHeaderWords + static_cast<size_t>(max_entries) * kKernelTimelineWords;
  DS_CUDA_CHECK(cudaMalloc(&slots_, words * sizeof(unsigned long long)));
  DS_CUDA_CHECK(cudaMemset(slots_, 0, words * sizeof(unsigned long long)));
  const unsigned long long capacity = static_cast<unsigned long long>(max_entries);
  DS_CUDA_CHECK(cudaMemcpy(slots_ + 1, &capacity, sizeof capacity, cudaMemcpyHostToDevice));
  for (KernelTimelineSetter set : setters()) set(slots_);
}

KernelTimeline::~KernelTimeline() {
  for (KernelTimelineSetter set : setters()) set(nullptr);
  cudaFree(slots_);
}

void KernelTimeline::open_log() {
  LaunchLog& log = launch_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  log.open = true;
  log.launches.clear();
}

std::vector<KernelLaunch> KernelTimeline::close_log() {
  LaunchLog& log = launch_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  log.open = false;
  return std::move(log.launches);
}

void KernelTimeline::clear(cudaStream_t stream) {
  DS_CUDA_CHECK(cudaMemsetAsync(slots_, 0, sizeof(unsigned long long), stream));
}

void KernelTimeline::write(const std::vector<KernelLaunch>& launches, cudaStream_t main_stream) const {
  DS_CUDA_CHECK(cudaDeviceSynchronize());
  unsigned long long count = 0;
  DS_CUDA_CHECK(cudaMemcpy(&count, slots_, sizeof count, cudaMemcpyDeviceToHost));
  // Kernels past the recording's launches ran after the replay (eager work on the stream).
  const size_t num_entries = std::min<size_t>({count, static_cast<size_t>(max_entries_), launches.size()});
  std::vector<unsigned long long> entries(num_entries * kKernelTimelineWords);
  DS_CUDA_CHECK(cudaMemcpy(entries.data(), slots_ + kKernelTimelineHeaderWords,
                           entries.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  std::ofstream out(path_);
  if (!out) {
    DS_LOG_WARN("kernel timeline: cannot write " << path_);
    return;
  }
  if (count > static_cast<unsigned long long>(max_entries_))
    DS_LOG_WARN("kernel timeline: " << count << " kernels, kept the first " << max_entries_);
  // Each stream's launches in order; an entry takes the first launch, of either stream, whose
  // grid is its grid.
  std::deque<const KernelLaunch*> main_queue, side_queue;
  for (const KernelLaunch& l : launches) (l.stream == main_stream ? main_queue : side_queue).push_back(&l);
  const unsigned long long origin = num_entries > 0 ? entries[0] : 0;
  const auto us_after_origin = [origin](unsigned long long ns) {
    return (static_cast<double>(ns) - static_cast<double>(origin)) / 1e3;
  };
  out << "order\tstream\tgrid\tentered_us\tresumed_us\tfirst_block_done_us\tkernel\n" << std::fixed
      << std::setprecision(3);
  for (size_t i = 0; i < num_entries; ++i) {
    const unsigned long long* e = &entries[i * kKernelTimelineWords];
    const unsigned grid_x = static_cast<unsigned>(e[2]), grid_y = static_cast<unsigned>(e[3] & 0xffffffffu),
                   grid_z = static_cast<unsigned>(e[3] >> 32);
    const KernelLaunch* launch = nullptr;
    const char* stream = "?";
    for (auto [queue, name] : {std::pair{&main_queue, "main"}, std::pair{&side_queue, "side"}}) {
      if (queue->empty()) continue;
      const dim3 grid = queue->front()->grid;
      if (grid.x != grid_x || grid.y != grid_y || grid.z != grid_z) continue;
      launch = queue->front();
      queue->pop_front();
      stream = name;
      break;
    }
    out << i << '\t' << stream << '\t' << grid_x << 'x' << grid_y << 'x' << grid_z << '\t' << us_after_origin(e[0])
        << '\t' << us_after_origin(e[1]) << '\t';
    if (e[4] != 0) out << us_after_origin(e[4]);
    else out << '-';  // the kernel did not note it
    out << '\t' << (launch != nullptr ? kernel_name(launch->kernel) : std::string("?")) << '\n';
  }
  DS_LOG_INFO("kernel timeline: " << num_entries << " kernels of the last replayed step (" << launches.size()
                                  << " launches recorded) written to " << path_);
}

std::unique_ptr<KernelTimeline> kernel_timeline_from_env() {
  if (!kKernelTimelineBuilt) return nullptr;
  const char* path = std::getenv("DSINFER_KERNEL_TIMELINE");
  if (path == nullptr || *path == '\0') return nullptr;
  return std::make_unique<KernelTimeline>(path, 1 << 16);
}

}  // namespace dsinfer::cuda
