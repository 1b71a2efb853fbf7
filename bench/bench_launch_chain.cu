// What a launch boundary costs in a chain of dependent kernels, against the same steps inside one
// persistent kernel. A batch-1 decode layer is a chain of about thirteen kernels, each waiting
// for the one before (docs/cuda.md, "Overlapped launches"); whether one persistent kernel a
// layer would be faster depends on this cost.
//
// Each step has the dependency shape of a norm before a product: every block reads the whole
// vector the step before wrote (2,048 floats), reduces it, and writes its own slice of the next
// vector. Chains of --steps such steps are recorded as one CUDA graph and replayed:
//  - launches: a kernel per step, either as programmatic dependents (the backend's launches:
//    each block waits, then lets the next kernel's blocks be scheduled) or in plain stream
//    order; with one block an SM (room for the next kernel's blocks beside), two or four (the
//    few-row products' blocks), or as many blocks as fit (none);
//  - the same work in fewer, larger blocks: one block an SM of four groups of 128 threads, each
//    group doing what a block of 128 does (so the groups read the vector as often as four
//    blocks would): what starting a block costs apart from its work;
//  - persistent: one kernel of one block an SM, its steps apart by a grid-wide barrier (an
//    arrival counter in global memory), or handed on by flags: each block publishes that its
//    slice of a step is written, and before the next step waits for every block's flag (no
//    counter that every block updates in turn; a flag a 128-byte line);
//  - persistent with leaner barriers: the arrival a release-add (`red.release.gpu`) instead of a
//    fence and an atomic add, or the blocks of a thread-block cluster meeting at the cluster's
//    own barrier first so that one arrival a cluster reaches the counter (a quarter of the
//    arrivals with clusters of four), with one block an SM or four (the few-row products' wave);
//  - the parts of a step: the persistent kernel without a hand-off (each block reads the vector
//    as it stands: what the step itself costs), and one block running the whole chain.
// Prints µs per step and each form's ratio to the persistent one.
//
// Usage: bench_launch_chain [--steps N] [--replays N] [--append RESULTS.md]
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_launch.cuh"
#include "cuda_bench.h"

namespace {

using dsinfer::cuda::await_previous_kernels;

using dsinfer::bench::BlockBarrier;
using dsinfer::bench::chain_step;
using dsinfer::bench::poll_until;
constexpr int kThreads = dsinfer::bench::kChainGroupThreads;
constexpr int kGroupsPerWideBlock = 4;  // groups of kThreads threads in a block of the wide form
constexpr int kWidth = dsinfer::bench::kChainWidth;

__global__ void __launch_bounds__(kThreads) step_kernel(const float* in, float* out) {
  await_previous_kernels();
  chain_step<1>(in, out, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x), BlockBarrier{});
}

__global__ void __launch_bounds__(kThreads * kGroupsPerWideBlock) wide_step_kernel(const float* in, float* out) {
  await_previous_kernels();
  chain_step<kGroupsPerWideBlock>(in, out, static_cast<int>(blockIdx.x * kGroupsPerWideBlock + threadIdx.x / kThreads),
                                  static_cast<int>(gridDim.x * kGroupsPerWideBlock), BlockBarrier{});
}

constexpr int kFlagStride = 32;  // unsigned a flag: one 128-byte line each

// This block's slice of step `step_done` - 1 is written: publish it, then wait until every
// block's is. The block's threads each watch some of the flags.
__device__ void hand_on_by_flags(unsigned* flags, unsigned step_done) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + blockIdx.x * kFlagStride), "r"(step_done)
                 : "memory");
  }
  for (unsigned j = threadIdx.x; j < gridDim.x; j += blockDim.x) poll_until(flags + j * kFlagStride, step_done);
  __threadfence();
  __syncthreads();
}

// How a persistent kernel's blocks hand one step on to the next.
enum class Handoff {
  kCounter,         // grid_barrier: a fence, an atomic add a block, polls with acquire loads
  kFlags,           // hand_on_by_flags
  kReleaseAdd,      // grid_barrier_release_add
  kClusterLeaders,  // grid_barrier_by_cluster, the cluster's first block polling for all
  kClusterArrival,  // grid_barrier_by_cluster, every block polling
  // None: the steps follow each other without waiting for the other blocks (each reads the
  // vector as it stands). With many blocks a lower bound of the step's own cost; with one
  // block the chain itself, its block barrier the only hand-off.
  kNone,
};

// One arrival with release semantics (cumulative over the block's writes that the block barrier
// ordered before it), in place of grid_barrier's fence and atomic add.
__device__ __forceinline__ void arrive_release(unsigned* arrived) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(arrived) : "memory");
}

__device__ void grid_barrier_release_add(unsigned* arrived, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    arrive_release(arrived);
    poll_until(arrived, target);
  }
  __syncthreads();
}

// The blocks of a cluster meet at the cluster's barrier (release and acquire at cluster scope),
// so that its first block's arrival speaks for all of them; `target` counts clusters. Either
// that block alone polls and a second cluster barrier lets the others go on, or every block's
// first thread polls.
__device__ void grid_barrier_by_cluster(unsigned* arrived, unsigned target, bool leader_polls) {
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();
  const bool leader = cluster.block_rank() == 0;
  if (threadIdx.x == 0 && leader) arrive_release(arrived);
  if (threadIdx.x == 0 && (leader || !leader_polls)) poll_until(arrived, target);
  if (leader_polls) cluster.sync();
  else __syncthreads();
}

// sync: the counter of the barriers, or for Handoff::kFlags gridDim.x flags. cluster_blocks:
// the launch's cluster size (the cluster hand-offs).
__global__ void __launch_bounds__(kThreads)
    persistent_kernel(float* a, float* b, int num_steps, unsigned* sync, Handoff handoff, int cluster_blocks) {
  const unsigned num_clusters = gridDim.x / static_cast<unsigned>(cluster_blocks);
  for (int k = 0; k < num_steps; ++k) {
    chain_step<1>(k % 2 == 0 ? a : b, k % 2 == 0 ? b : a, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x),
                  BlockBarrier{});
    const unsigned step_done = static_cast<unsigned>(k + 1);
    switch (handoff) {
      case Handoff::kCounter: dsinfer::bench::grid_barrier(sync, step_done * gridDim.x, BlockBarrier{}); break;
      case Handoff::kFlags: hand_on_by_flags(sync, step_done); break;
      case Handoff::kReleaseAdd: grid_barrier_release_add(sync, step_done * gridDim.x); break;
      case Handoff::kClusterLeaders: grid_barrier_by_cluster(sync, step_done * num_clusters, true); break;
      case Handoff::kClusterArrival: grid_barrier_by_cluster(sync, step_done * num_clusters, false); break;
      case Handoff::kNone: break;
    }
  }
}

// The persistent kernel's launch of `blocks` blocks, in clusters of cluster_blocks where that is
// above 1 (`cluster`: the attribute that the configuration points to).
cudaLaunchConfig_t persistent_config(int blocks, int cluster_blocks, cudaStream_t stream,
                                     cudaLaunchAttribute& cluster) {
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(cluster_blocks);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = cluster_blocks > 1 ? 1 : 0;
  return config;
}

void launch_persistent(int blocks, int cluster_blocks, cudaStream_t stream, float* a, float* b, int num_steps,
                       unsigned* sync, Handoff handoff) {
  cudaLaunchAttribute cluster;
  const cudaLaunchConfig_t config = persistent_config(blocks, cluster_blocks, stream, cluster);
  DS_CUDA_CHECK(cudaLaunchKernelEx(&config, persistent_kernel, a, b, num_steps, sync, handoff, cluster_blocks));
}

void launch_step(int blocks, bool wide, bool dependent, cudaStream_t stream, const float* in, float* out) {
  cudaLaunchAttribute overlap;
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(wide ? kThreads * kGroupsPerWideBlock : kThreads);
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = dependent ? 1 : 0;
  DS_CUDA_CHECK(cudaLaunchKernelEx(&config, wide ? wide_step_kernel : step_kernel, in, out));
}

struct Form {
  std::string name;
  int blocks = 0;
  bool persistent = false, dependent = false, wide = false;
  Handoff handoff = Handoff::kCounter;  // the persistent forms'
  int cluster_blocks = 1;               // the cluster hand-offs' cluster size
  double us_per_step = 0;
};

// µs per step of `form`: its chain of num_steps steps recorded once, replayed num_replays times
// after a few untimed replays.
double time_form(const Form& form, int num_steps, int num_replays, float* a, float* b, unsigned* sync,
                 cudaStream_t stream) {
  const auto record = [&](cudaStream_t s) {
    if (form.persistent) {
      const size_t sync_bytes = (form.handoff == Handoff::kFlags ? form.blocks * kFlagStride : 1) * sizeof(unsigned);
      DS_CUDA_CHECK(cudaMemsetAsync(sync, 0, sync_bytes, s));
      launch_persistent(form.blocks, form.cluster_blocks, s, a, b, num_steps, sync, form.handoff);
    } else {
      for (int k = 0; k < num_steps; ++k)
        launch_step(form.blocks, form.wide, form.dependent, s, k % 2 == 0 ? a : b, k % 2 == 0 ? b : a);
    }
  };
  return 1e3 * dsinfer::bench::graph_replay_ms(record, 5, num_replays, stream) / num_steps;
}

}  // namespace

int main(int argc, char** argv) {
  dsinfer::bench::ChainOptions options;
  if (!dsinfer::bench::parse_chain_options(argc, argv, options)) return 2;
  const int num_steps = options.num_steps, num_replays = options.num_replays;
  cudaDeviceProp prop;
  if (!dsinfer::bench::first_device("bench_launch_chain", prop)) return 1;
  int per_sm = 0;
  DS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, step_kernel, kThreads, 0));
  const int sms = prop.multiProcessorCount;
  float *a = nullptr, *b = nullptr;
  unsigned* sync = nullptr;  // the barrier's counter, or the blocks' flags
  DS_CUDA_CHECK(cudaMalloc(&a, kWidth * sizeof(float)));
  DS_CUDA_CHECK(cudaMalloc(&b, kWidth * sizeof(float)));
  DS_CUDA_CHECK(cudaMalloc(&sync, static_cast<size_t>(sms) * kFlagStride * sizeof(unsigned)));
  // A vector of RMS 3: every step brings it to 1, so a chain that ran leaves RMS 1.
  const std::vector<float> threes(kWidth, 3.0f);
  DS_CUDA_CHECK(cudaMemcpy(a, threes.data(), kWidth * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t stream;
  DS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  constexpr int kClusterBlocks = 4;
  // Grids of whole clusters of n blocks, at most `blocks`.
  const auto whole_clusters = [](int blocks, int n) { return blocks / n * n; };
  const int cluster_sms = whole_clusters(sms, kClusterBlocks);
  std::vector<Form> forms = {
      {"persistent kernel, grid-wide barrier between steps", sms, true, false},
      {"persistent kernel, steps handed on by every block's flag", sms, true, false, false, Handoff::kFlags},
      {"persistent kernel, release-add barrier", sms, true, false, false, Handoff::kReleaseAdd},
      {"persistent kernel, clusters of 4 meet first, their first block arrives and polls", cluster_sms, true, false,
       false, Handoff::kClusterLeaders, kClusterBlocks},
      {"persistent kernel, clusters of 4 meet first, their first block arrives, every block polls", cluster_sms, true,
       false, false, Handoff::kClusterArrival, kClusterBlocks},
      {"persistent kernel, clusters of 2 meet first, their first block arrives and polls", whole_clusters(sms, 2),
       true, false, false, Handoff::kClusterLeaders, 2},
      {"persistent kernel, clusters of 8 meet first, their first block arrives and polls", whole_clusters(sms, 8),
       true, false, false, Handoff::kClusterLeaders, 8},
      {"persistent kernel, no hand-off (the steps' own cost)", sms, true, false, false, Handoff::kNone},
      {"one block runs the whole chain, its block barrier the hand-off", 1, true, false, false, Handoff::kNone},
      {"persistent kernel, four blocks an SM, grid-wide barrier", 4 * sms, true, false},
      {"persistent kernel, four blocks an SM, release-add barrier", 4 * sms, true, false, false, Handoff::kReleaseAdd},
      {"persistent kernel, four blocks an SM, clusters of 4 meet first, their first block arrives and polls",
       4 * cluster_sms, true, false, false, Handoff::kClusterLeaders, kClusterBlocks},
      {"a kernel a step, programmatic dependents, one block an SM", sms, false, true},
      {"a kernel a step, programmatic dependents, two blocks an SM", 2 * sms, false, true},
      {"a kernel a step, programmatic dependents, four blocks an SM", 4 * sms, false, true},
      {"a kernel a step, programmatic dependents, one block of four 128-thread groups an SM", sms, false, true,
       true},
      {"a kernel a step, programmatic dependents, every resident block", sms * per_sm, false, true},
      {"a kernel a step, stream order, one block an SM", sms, false, false},
      {"a kernel a step, stream order, every resident block", sms * per_sm, false, false},
  };
  // A persistent kernel's blocks must all be resident at once, or its barriers never open.
  int persistent_per_sm = 0;
  DS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&persistent_per_sm, persistent_kernel, kThreads, 0));
  for (const Form& f : forms) {
    if (!f.persistent) continue;
    int resident = sms * persistent_per_sm;
    if (f.cluster_blocks > 1) {
      cudaLaunchAttribute cluster;
      const cudaLaunchConfig_t config = persistent_config(f.blocks, f.cluster_blocks, stream, cluster);
      int clusters = 0;
      DS_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, persistent_kernel, &config));
      resident = clusters * f.cluster_blocks;
    }
    if (f.blocks > resident) {
      std::fprintf(stderr, "bench_launch_chain: %s needs %d blocks resident, %d fit\n", f.name.c_str(), f.blocks,
                   resident);
      return 1;
    }
  }
  for (Form& f : forms) f.us_per_step = time_form(f, num_steps, num_replays, a, b, sync, stream);
  // The chains must have computed: the vector normalised again and again has RMS 1. Step k
  // writes b when k is even, a when it is odd.
  const double mean_square = dsinfer::bench::device_mean_square(num_steps % 2 == 0 ? a : b, kWidth);
  if (std::abs(mean_square - 1.0) > 1e-3) {
    std::fprintf(stderr, "bench_launch_chain: the chain's output has mean square %g, not 1\n", mean_square);
    return 1;
  }

  std::ostringstream text;
  text << "\n## Launch boundaries in a chain of dependent kernels (" << dsinfer::bench::utc_date() << ")\n\n"
       << "Machine: " << prop.name << " (" << sms << " SMs). Command: `build-gpu/bench_launch_chain";
  for (int i = 1; i < argc; ++i) text << " " << argv[i];
  text << "`\n\n" << num_steps << " steps a chain, each reading a " << kWidth
       << "-float vector whole and writing a slice of the next, recorded as one graph and replayed " << num_replays
       << " times; " << kThreads << " threads a block, " << per_sm << " blocks an SM resident at most.\n\n"
       << "| form | blocks | µs per step | ratio to the persistent kernel |\n|---|---:|---:|---:|\n";
  char line[256];
  for (const Form& f : forms) {
    std::snprintf(line, sizeof(line), "| %s | %d | %.2f | %.2f |\n", f.name.c_str(), f.blocks, f.us_per_step,
                  f.us_per_step / forms[0].us_per_step);
    text << line;
  }
  std::fputs(text.str().c_str(), stdout);
  if (!options.append_path.empty()) dsinfer::bench::append_results(options.append_path, text.str());
  DS_CUDA_CHECK(cudaStreamDestroy(stream));
  DS_CUDA_CHECK(cudaFree(a));
  DS_CUDA_CHECK(cudaFree(b));
  DS_CUDA_CHECK(cudaFree(sync));
  return 0;
}
