// Whether a weight stream can run beside a chain of dependent steps without slowing it: the
// question a per-layer persistent kernel for batch-1 decode rests on. A decode layer at batch 1
// alternates weight reads with short chains of dependent steps (norms, attention, routing)
// during which memory sits idle; such a kernel would load the next products' weights while
// those chains run. bench_launch_chain measured the chain's hand-offs; this measures what
// streaming beside it costs the chain, and what the stream gets.
//
// One persistent kernel, one block an SM. A block's first 128 threads run the chain: each step
// reads a 2,048-float vector whole (written by every block the step before), reduces it and
// writes the block's slice of the next, with a grid-wide barrier between steps (an arrival
// counter). The block's other threads (the streamers) read a weight buffer far larger than L2,
// each block its own slice round and round, a few 16-byte loads a thread at a time, until the
// chain's last step is done. Forms: the chain alone (no streamers), the chain with 64 to 256
// streamers a block keeping 2 to 8 loads each in flight (how hard the stream presses), and the
// chain with one thread a block streaming by bulk copies into a ring of shared-memory stages
// (the copy engine's way: a few instructions a stage instead of a load a thread).
// Printed: µs a chain step, and the streamers' GB/s against a plain read of the same buffer by
// every resident thread (the ceiling, measured in the same run).
//
// Usage: bench_chain_and_stream [--steps N] [--replays N] [--append RESULTS.md]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/mbarrier.cuh"
#include "cuda_bench.h"

namespace {

constexpr int kChainThreads = dsinfer::bench::kChainGroupThreads;
constexpr int kMaxStreamThreads = 256;
constexpr int kMaxThreads = kChainThreads + kMaxStreamThreads;
constexpr int kMaxInFlight = 8;     // 16-byte loads a streamer has in flight, at most
constexpr int kWidth = dsinfer::bench::kChainWidth;
constexpr int kPollEvery = 16;      // a streamer's rounds between looks at the chain's done flag
constexpr int kCeilingThreads = 256;
constexpr int kMaxBulkStageBytes = 16 * 1024;  // a bulk copy's stage, at most
constexpr int kMaxBulkStages = 8;

// The chain's threads meet at barrier 1, so the streamers never wait for them.
struct ChainBarrier {
  __device__ void operator()() const { asm volatile("bar.sync 1, %0;" ::"n"(kChainThreads) : "memory"); }
};

struct Counters {
  unsigned arrived;           // the chain's barrier
  unsigned done;              // set once the chain's last step is done
  unsigned long long loads;   // 16-byte loads the streamers made
  unsigned long long sink;    // keeps the streamed values live
};

// The chain's threads: num_steps steps between a and b, then the done flag (by block 0).
__device__ void run_chain(float* a, float* b, int num_steps, Counters* counters) {
  for (int k = 0; k < num_steps; ++k) {
    dsinfer::bench::chain_step<1>(k % 2 == 0 ? a : b, k % 2 == 0 ? b : a, static_cast<int>(blockIdx.x),
                                  static_cast<int>(gridDim.x), ChainBarrier{});
    dsinfer::bench::grid_barrier(&counters->arrived, static_cast<unsigned>(k + 1) * gridDim.x, ChainBarrier{});
  }
  if (blockIdx.x == 0 && threadIdx.x == 0)
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(&counters->done), "r"(1u) : "memory");
}

__device__ __forceinline__ bool chain_done(const Counters* counters) {
  unsigned done = 0;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(done) : "l"(&counters->done) : "memory");
  return done != 0;
}

// a, b: the chain's two vectors; weights: the buffer, slice_loads 16-byte pieces a block (a
// multiple of kMaxInFlight * kMaxStreamThreads). The block's threads past kChainThreads stream.
template <int kInFlight>
__global__ void __launch_bounds__(kMaxThreads)
    chain_and_stream_kernel(float* a, float* b, int num_steps, const int4* weights, int64_t slice_loads,
                            Counters* counters) {
  if (threadIdx.x < kChainThreads) {
    run_chain(a, b, num_steps, counters);
    return;
  }
  const int st = threadIdx.x - kChainThreads, num_streamers = blockDim.x - kChainThreads;
  const int4* slice = weights + blockIdx.x * slice_loads;
  const int64_t round = static_cast<int64_t>(kInFlight) * num_streamers;
  unsigned x = 0;
  unsigned long long loads = 0;
  // slice_loads is a whole number of rounds, so a round never runs past the slice's end.
  for (int64_t i = st, r = 0;; ++r) {
    int4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) v[u] = __ldcs(slice + i + u * num_streamers);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) x ^= static_cast<unsigned>(v[u].x ^ v[u].y ^ v[u].z ^ v[u].w);
    loads += kInFlight;
    i += round;
    if (i >= slice_loads) i -= slice_loads;
    if (r % kPollEvery == kPollEvery - 1 && chain_done(counters)) break;
  }
  atomicAdd(&counters->loads, loads);
  if (x == 0x9e3779b9u) atomicAdd(&counters->sink, 1ull);  // never in practice; keeps x computed
}

// The same chain beside one thread that streams the block's slice by bulk copies of stage_bytes
// (a multiple of 16 dividing the slice) into num_stages shared-memory stages (dynamic shared
// memory), each stage re-issued as soon as its copy has landed, until the chain is done.
__global__ void __launch_bounds__(kChainThreads + 32)
    chain_and_bulk_stream_kernel(float* a, float* b, int num_steps, const int4* weights, int64_t slice_loads,
                                 int num_stages, int stage_bytes, Counters* counters) {
  extern __shared__ __align__(128) uint8_t stages[];
  __shared__ __align__(8) uint64_t landed[kMaxBulkStages];
  if (threadIdx.x < kChainThreads) {
    run_chain(a, b, num_steps, counters);
    return;
  }
  if (threadIdx.x != kChainThreads) return;
  using namespace dsinfer::cuda;
  const auto* slice = reinterpret_cast<const uint8_t*>(weights + blockIdx.x * slice_loads);
  const int64_t slice_bytes = slice_loads * 16;
  const uint32_t bar0 = static_cast<uint32_t>(__cvta_generic_to_shared(landed));
  const uint32_t stage0 = static_cast<uint32_t>(__cvta_generic_to_shared(stages));
  for (int st = 0; st < num_stages; ++st) mbarrier_init(bar0 + 8 * st, 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  int64_t offset = 0;
  const auto issue = [&](int st) {
    mbarrier_arrive_expect_bytes(bar0 + 8 * st, stage_bytes);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            stage0 + st * stage_bytes),
        "l"(slice + offset), "r"(stage_bytes), "r"(bar0 + 8 * st)
        : "memory");
    offset += stage_bytes;
    if (offset >= slice_bytes) offset = 0;
  };
  for (int st = 0; st < num_stages; ++st) issue(st);
  unsigned long long copies = 0;
  uint32_t round = 0;  // a stage's copy of round r completes its barrier's phase of parity r % 2
  for (;; ++round) {
    for (int st = 0; st < num_stages; ++st) {
      mbarrier_wait(bar0 + 8 * st, round & 1u);
      ++copies;
      issue(st);
    }
    if (chain_done(counters)) break;
  }
  // The copies still in flight land before the block's shared memory goes away.
  for (int st = 0; st < num_stages; ++st) mbarrier_wait(bar0 + 8 * st, (round + 1) & 1u);
  atomicAdd(&counters->loads, copies * (stage_bytes / 16));
}

// The ceiling: every resident thread reads the buffer once, kMaxInFlight pieces at a time.
__global__ void __launch_bounds__(kCeilingThreads) stream_kernel(const int4* weights, int64_t num_loads,
                                                                 unsigned long long* sink) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kCeilingThreads;
  unsigned x = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kCeilingThreads) + threadIdx.x; i < num_loads;
       i += stride * kMaxInFlight) {
    int4 v[kMaxInFlight];
#pragma unroll
    for (int u = 0; u < kMaxInFlight; ++u)
      v[u] = i + u * stride < num_loads ? __ldcs(weights + i + u * stride) : int4{};
#pragma unroll
    for (int u = 0; u < kMaxInFlight; ++u) x ^= static_cast<unsigned>(v[u].x ^ v[u].y ^ v[u].z ^ v[u].w);
  }
  if (x == 0x9e3779b9u) atomicAdd(sink, 1ull);
}

}  // namespace

int main(int argc, char** argv) {
  dsinfer::bench::ChainOptions options;
  options.num_replays = 50;
  if (!dsinfer::bench::parse_chain_options(argc, argv, options)) return 2;
  const int num_steps = options.num_steps, num_replays = options.num_replays;
  cudaDeviceProp prop;
  if (!dsinfer::bench::first_device("bench_chain_and_stream", prop)) return 1;
  const int sms = prop.multiProcessorCount;
  // 2 GiB of weights (40 times the L2), an equal slice a block, a whole number of every form's
  // rounds (and of bulk stages).
  const int64_t round = static_cast<int64_t>(kMaxInFlight) * kMaxStreamThreads;
  const int64_t slice_loads = (int64_t{2} << 30) / 16 / sms / round * round;
  const int64_t num_loads = slice_loads * sms;
  int4* weights = nullptr;
  float *a = nullptr, *b = nullptr;
  Counters* counters = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&weights, num_loads * sizeof(int4)));
  DS_CUDA_CHECK(cudaMemset(weights, 0x5a, num_loads * sizeof(int4)));
  DS_CUDA_CHECK(cudaMalloc(&a, kWidth * sizeof(float)));
  DS_CUDA_CHECK(cudaMalloc(&b, kWidth * sizeof(float)));
  DS_CUDA_CHECK(cudaMalloc(&counters, sizeof(Counters)));
  cudaStream_t stream;
  DS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  struct Form {
    int num_streamers, in_flight;
    int bulk_stages = 0;  // > 0: one thread streams by bulk copies into this many stages instead,
    int bulk_kb = 16;     // of this many KB each
    double us_per_step = 0, stream_gbs = 0;
  };
  std::vector<Form> forms = {{0, 0},       {256, 8},     {256, 4},     {256, 2},     {128, 4},
                             {64, 4},      {64, 2},      {0, 0, 1, 4}, {0, 0, 1, 8}, {0, 0, 2, 8},
                             {0, 0, 1, 16}, {0, 0, 2, 16}, {0, 0, 4, 16}, {0, 0, 8, 16}};
  DS_CUDA_CHECK(cudaFuncSetAttribute(chain_and_bulk_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kMaxBulkStages * kMaxBulkStageBytes));
  // Each replay starts from a vector of RMS 3 (every step brings it to 1) and fresh counters.
  const std::vector<float> threes(kWidth, 3.0f);
  for (Form& f : forms) {
    const auto kernel = f.in_flight == 8   ? chain_and_stream_kernel<8>
                        : f.in_flight == 4 ? chain_and_stream_kernel<4>
                                           : chain_and_stream_kernel<2>;
    const auto record = [&](cudaStream_t s) {
      DS_CUDA_CHECK(cudaMemsetAsync(counters, 0, sizeof(Counters), s));
      if (f.bulk_stages > 0)
        chain_and_bulk_stream_kernel<<<sms, kChainThreads + 32, f.bulk_stages * f.bulk_kb * 1024, s>>>(
            a, b, num_steps, weights, slice_loads, f.bulk_stages, f.bulk_kb * 1024, counters);
      else
        kernel<<<sms, kChainThreads + f.num_streamers, 0, s>>>(a, b, num_steps, weights, slice_loads, counters);
      DS_CUDA_CHECK(cudaGetLastError());
    };
    DS_CUDA_CHECK(cudaMemcpy(a, threes.data(), kWidth * sizeof(float), cudaMemcpyHostToDevice));
    const double ms = dsinfer::bench::graph_replay_ms(record, 3, num_replays, stream);
    Counters c;
    DS_CUDA_CHECK(cudaMemcpy(&c, counters, sizeof(Counters), cudaMemcpyDeviceToHost));
    f.us_per_step = 1e3 * ms / num_steps;
    f.stream_gbs = static_cast<double>(c.loads) * 16 / (ms * 1e-3) / 1e9;  // the last replay's loads
    // The chain must have computed: normalised again and again, the vector has RMS 1; and
    // streamers must have read.
    const double mean_square = dsinfer::bench::device_mean_square(num_steps % 2 == 0 ? a : b, kWidth);
    if (std::abs(mean_square - 1.0) > 1e-3 || (f.num_streamers > 0 || f.bulk_stages > 0) != (c.loads > 0)) {
      std::fprintf(stderr, "bench_chain_and_stream: mean square %g (not 1), or %llu loads by %d streamers\n",
                   mean_square, c.loads, f.num_streamers);
      return 1;
    }
  }
  int ceiling_per_sm = 0;
  DS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ceiling_per_sm, stream_kernel, kCeilingThreads, 0));
  const double ceiling_ms = dsinfer::bench::graph_replay_ms(
      [&](cudaStream_t s) {
        stream_kernel<<<sms * ceiling_per_sm, kCeilingThreads, 0, s>>>(weights, num_loads, &counters->sink);
        DS_CUDA_CHECK(cudaGetLastError());
      },
      3, num_replays, stream);
  const double ceiling_gbs = static_cast<double>(num_loads) * 16 / (ceiling_ms * 1e-3) / 1e9;

  std::ostringstream text;
  text << "\n## A weight stream beside a chain of dependent steps (" << dsinfer::bench::utc_date() << ")\n\n"
       << "Machine: " << prop.name << " (" << sms << " SMs). Command: `build-gpu/bench_chain_and_stream";
  for (int i = 1; i < argc; ++i) text << " " << argv[i];
  text << "`\n\nOne persistent kernel, one block an SM: " << kChainThreads << " threads a block run " << num_steps
       << " chain steps (a " << kWidth << "-float vector read whole, a slice of the next written, a grid-wide "
       << "barrier), the block's other threads read a 2 GiB buffer until the chain is done. Ceiling: every "
       << "resident thread reading the buffer once, " << kMaxInFlight << " 16-byte loads in flight each.\n\n"
       << "| form | µs a chain step | streamed GB/s | of the ceiling (" << static_cast<int>(ceiling_gbs)
       << " GB/s) |\n|---|---:|---:|---:|\n";
  char line[256];
  for (const Form& f : forms) {
    if (f.bulk_stages > 0) {
      std::snprintf(line, sizeof(line),
                    "| one thread a block, bulk copies into %d stages of %d KB | %.2f (%.2f times) | %.0f | %.0f%% |\n",
                    f.bulk_stages, f.bulk_kb, f.us_per_step, f.us_per_step / forms[0].us_per_step,
                    f.stream_gbs, 100.0 * f.stream_gbs / ceiling_gbs);
    } else if (f.num_streamers == 0) {
      std::snprintf(line, sizeof(line), "| the chain alone | %.2f | – | – |\n", f.us_per_step);
    } else {
      std::snprintf(line, sizeof(line),
                    "| %d streamers a block, %d loads each in flight | %.2f (%.2f times) | %.0f | %.0f%% |\n",
                    f.num_streamers, f.in_flight, f.us_per_step, f.us_per_step / forms[0].us_per_step, f.stream_gbs,
                    100.0 * f.stream_gbs / ceiling_gbs);
    }
    text << line;
  }
  std::fputs(text.str().c_str(), stdout);
  if (!options.append_path.empty()) dsinfer::bench::append_results(options.append_path, text.str());
  DS_CUDA_CHECK(cudaStreamDestroy(stream));
  DS_CUDA_CHECK(cudaFree(weights));
  DS_CUDA_CHECK(cudaFree(a));
  DS_CUDA_CHECK(cudaFree(b));
  DS_CUDA_CHECK(cudaFree(counters));
  return 0;
}
