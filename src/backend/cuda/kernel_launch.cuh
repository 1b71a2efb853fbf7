// Kernel launches that overlap each kernel's start with the end of the one before it
// (programmatic dependent launch, Hopper).
//
// A decode step at small batch is a chain of some twenty short kernels per layer, and the GPU
// otherwise idles between two of them while the second is launched and its blocks start. With
// this launch the next kernel may be scheduled as soon as every block of the current one has
// begun; its blocks then wait, before touching memory, until the kernels before it on the
// stream have finished and their writes are visible. The rule that makes it safe: every block
// of every kernel of the backend calls await_previous_kernels() before it writes anything, reads
// anything another kernel may write, or returns, so a finished kernel implies that all kernels
// before it have finished too. Weights, which no kernel writes, may be read before it. So may
// what a kernel at least two launches back wrote: a kernel's blocks are scheduled only once
// every block of the one before it has returned from its own wait, by which time everything
// before that one has finished.
// DSINFER_PDL=0 launches every kernel in plain stream order instead (same results).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_timeline.h"

namespace dsinfer::cuda {

#ifdef DSINFER_KERNEL_TIMELINE
namespace {
// This translation unit's pointer to the kernel timeline's slots (kernel_timeline.h).
__device__ unsigned long long* kernel_timeline_slots = nullptr;

void set_kernel_timeline_slots(unsigned long long* slots) {
  DS_CUDA_CHECK(cudaMemcpyToSymbol(kernel_timeline_slots, &slots, sizeof slots));
}

[[maybe_unused]] const bool kernel_timeline_slots_registered =
    register_kernel_timeline_setter(&set_kernel_timeline_slots);

__device__ __forceinline__ unsigned long long global_time_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ bool first_thread_of_grid() {
  return (threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0;
}

// The kernel's entry in the slots; null where the slots are full.
__device__ __forceinline__ unsigned long long* append_kernel_time(unsigned long long entered_ns) {
  const unsigned long long resumed_ns = global_time_ns();
  unsigned long long* slots = kernel_timeline_slots;
  const unsigned long long i = atomicAdd(slots, 1ull);
  if (i >= slots[1]) return nullptr;
  unsigned long long* e = slots + kKernelTimelineHeaderWords + i * kKernelTimelineWords;
  e[0] = entered_ns;
  e[1] = resumed_ns;
  e[2] = gridDim.x;
  e[3] = gridDim.y | (static_cast<unsigned long long>(gridDim.z) << 32);
  e[4] = 0;
  return e;
}
}  // namespace
#endif

// What await_previous_kernels returns: in timeline builds, the grid's first thread's entry in
// the timeline; null in other threads, where none is kept, and in other builds.
struct KernelTimelineEntry {
  unsigned long long* words = nullptr;
};

// Called by every block before its first write, its first read of kernel-written data and any
// return: waits for the kernels before it (a no-op when it was launched in plain stream order),
// then lets the next kernel's blocks be scheduled.
__device__ __forceinline__ KernelTimelineEntry await_previous_kernels() {
  KernelTimelineEntry entry;
#ifdef DSINFER_KERNEL_TIMELINE
  const bool timed = first_thread_of_grid() && kernel_timeline_slots != nullptr;
  const unsigned long long entered_ns = timed ? global_time_ns() : 0;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (timed) entry.words = append_kernel_time(entered_ns);
#else
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  return entry;
}

// Called with what await_previous_kernels returned, once the first block's own work is done
// and its writes issued: the time goes to the kernel's entry as first_block_done. A no-op
// outside timeline builds and in every thread but the grid's first.
__device__ __forceinline__ void note_first_block_done(KernelTimelineEntry entry) {
#ifdef DSINFER_KERNEL_TIMELINE
  if (entry.words != nullptr) entry.words[4] = global_time_ns();
#else
  (void)entry;
#endif
}

// Lets `Kernel` use shared_bytes of dynamic shared memory, past the 48 KB a launch gets by
// default; the first call for each kernel sets the attribute, later calls do nothing (the
// caller passes the same size every time).
template <auto Kernel>
void allow_shared_bytes(size_t shared_bytes) {
  static const bool allowed = [shared_bytes] {
    DS_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared_bytes)));
    return true;
  }();
  (void)allowed;
}

// Whether launches overlap (DSINFER_PDL, read once).
bool overlapped_launches_enabled();
// The current device's multiprocessor count (read once).
int device_multiprocessors();

template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, Stream stream,
                   Args&&... args) {
  cudaLaunchAttribute overlap;
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = overlapped_launches_enabled() ? 1 : 0;
  if constexpr (kKernelTimelineBuilt) log_kernel_launch(reinterpret_cast<const void*>(kernel), grid, stream);
  DS_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// The same launch with thread-block clusters of cluster_dims blocks.
template <typename... Params, typename... Args>
void launch_cluster_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, dim3 cluster_dims, Stream stream,
                           Args&&... args) {
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = cluster_dims.x;
  attrs[0].val.clusterDim.y = cluster_dims.y;
  attrs[0].val.clusterDim.z = cluster_dims.z;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = overlapped_launches_enabled() ? 2 : 1;
  if constexpr (kKernelTimelineBuilt) log_kernel_launch(reinterpret_cast<const void*>(kernel), grid, stream);
  DS_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace dsinfer::cuda
