// The dense GEMM ceiling of the CUDA device, for benchmarks that report prefill throughput as a
// fraction of it. Plain C++ (no CUDA headers), like cuda_backend_factory.h.
#pragma once

namespace dsinfer::cuda {

// bf16 x bf16 → fp32 GEMM rate of device 0 through LtMatmul::bf16 (the path the backend's
// linear layers take), in FLOP/s: 8192 x 8192 x 8192 on random inputs, best of several
// timed groups after a warm-up, timed with CUDA events. Allocates ~0.7 GB while it runs.
double measure_bf16_gemm_flops_per_s();

}  // namespace dsinfer::cuda
