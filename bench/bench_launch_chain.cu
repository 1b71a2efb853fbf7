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
//    counter that every block updates in turn; a flag a 128-byte line).
// Prints µs per step and each form's ratio to the persistent one.
//
// Usage: bench_launch_chain [--steps N] [--replays N] [--append RESULTS.md]
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
  for (unsigned j = threadIdx.x; j < gridDim.x; j += blockDim.x) {
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(flags + j * kFlagStride) : "memory");
    } while (seen < step_done);
  }
  __threadfence();
  __syncthreads();
}

// sync: the grid-wide barrier on `sync` (one counter) or, with by_flags, the flags there
// (gridDim.x of them).
__global__ void __launch_bounds__(kThreads)
    persistent_kernel(float* a, float* b, int num_steps, unsigned* sync, bool by_flags) {
  for (int k = 0; k < num_steps; ++k) {
    chain_step<1>(k % 2 == 0 ? a : b, k % 2 == 0 ? b : a, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x),
                  BlockBarrier{});
    if (by_flags) hand_on_by_flags(sync, static_cast<unsigned>(k + 1));
    else dsinfer::bench::grid_barrier(sync, static_cast<unsigned>(k + 1) * gridDim.x, BlockBarrier{});
  }
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
  bool persistent = false, dependent = false, wide = false, by_flags = false;
  double us_per_step = 0;
};

// µs per step of `form`: its chain of num_steps steps recorded once, replayed num_replays times
// after a few untimed replays.
double time_form(const Form& form, int num_steps, int num_replays, float* a, float* b, unsigned* sync,
                 cudaStream_t stream) {
  const auto record = [&](cudaStream_t s) {
    if (form.persistent) {
      const size_t sync_bytes = (form.by_flags ? form.blocks * kFlagStride : 1) * sizeof(unsigned);
      DS_CUDA_CHECK(cudaMemsetAsync(sync, 0, sync_bytes, s));
      persistent_kernel<<<form.blocks, kThreads, 0, s>>>(a, b, num_steps, sync, form.by_flags);
      DS_CUDA_CHECK(cudaGetLastError());
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

  std::vector<Form> forms = {
      {"persistent kernel, grid-wide barrier between steps", sms, true, false},
      {"persistent kernel, steps handed on by every block's flag", sms, true, false, false, true},
      {"a kernel a step, programmatic dependents, one block an SM", sms, false, true},
      {"a kernel a step, programmatic dependents, two blocks an SM", 2 * sms, false, true},
      {"a kernel a step, programmatic dependents, four blocks an SM", 4 * sms, false, true},
      {"a kernel a step, programmatic dependents, one block of four 128-thread groups an SM", sms, false, true,
       true},
      {"a kernel a step, programmatic dependents, every resident block", sms * per_sm, false, true},
      {"a kernel a step, stream order, one block an SM", sms, false, false},
      {"a kernel a step, stream order, every resident block", sms * per_sm, false, false},
  };
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
