// Shared-memory barriers with phases (mbarrier, sm_80 and up): a producer and its consumers hand
// pipeline stages to each other without block-wide barriers. A barrier counts arrivals up to
// the count it was set up with, then completes its phase and starts the next; waiters name the
// parity of the phase they wait for (0, 1, 0, … for the 1st, 2nd, 3rd, … completion).
#pragma once

#include <cstdint>

namespace dsinfer::cuda {

// By one thread, before the block's barrier that publishes the setup.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t num_arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(num_arrivals) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile(
      "{\n"
      ".reg .b64 state;\n"
      "mbarrier.arrive.shared::cta.b64 state, [%0];\n"
      "}\n" ::"r"(bar)
      : "memory");
}

// An arrival made once all of this thread's earlier cp.async copies have landed, counted as one
// of the arrivals the barrier expects.
__device__ __forceinline__ void mbarrier_arrive_after_copies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// One arrival that also tells the barrier to expect `bytes` more from asynchronous copies (TMA)
// completing on it: the phase completes once the arrivals are counted and the bytes have landed.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile(
      "{\n"
      ".reg .b64 state;\n"
      "mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n"
      "}\n" ::"r"(bar),
      "r"(bytes)
      : "memory");
}

// Returns once the phase of this parity has completed (its writes then visible to the caller).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

}  // namespace dsinfer::cuda
