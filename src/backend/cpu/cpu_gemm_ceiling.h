// The dense matmul ceiling of the CPU backend, for benchmarks that report prefill throughput
// as a fraction of it.
#pragma once

namespace dsinfer::cpu {

// fp32 rate (FLOP/s) of the CPU backend's own matmul_xwt on all pool threads: 512 rows x
// 2048 x 2048 on random inputs, best of a few runs after a warm-up. About 0.05 s per GFLOP/s
// of machine; a peer of the forward pass rather than a hardware peak.
double measure_matmul_flops_per_s();

}  // namespace dsinfer::cpu
