// The dense GEMM ceiling of the CUDA device, for benchmarks that report prefill throughput as a
// fraction of it. Plain C++ (no CUDA headers), like cuda_backend_factory.h.
#pragma once

namespace dsinfer::cuda {

// bf16 x bf16 → fp32 GEMM rate of device 0 through LtMatmul::bf16 (the path the backend's
// linear layers take), in FLOP/s: 8192 x 8192 x 8192 on random inputs, best of several
// timed groups after a warm-up, timed with CUDA events. Allocates ~0.7 GB while it runs.
// sustained_window_s > 0: instead the rate over products run back to back for that long, the
// rate a pass of that length gets once the power limit has brought the clocks down.
double measure_bf16_gemm_flops_per_s(double sustained_window_s = 0);
// The same for DeepSeek's FP8 product through LtMatmul::fp8 (e4m3 operands, activations scaled
// per 1x128 tile, weights per 128x128 block, fp32 output); 0 when cuBLASLt has no algorithm.
double measure_fp8_gemm_flops_per_s(double sustained_window_s = 0);

}  // namespace dsinfer::cuda
