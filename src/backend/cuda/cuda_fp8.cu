// FP8 helpers for DeepSeek's block-scaled recipe: per-(token, 128 columns) activation
// quantisation in the layout cuBLASLt's VEC128_32F scaling reads, and dequantisation of
// 128x128-block weights for shapes the FP8 matmul cannot take.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {
namespace {

constexpr float kFp8Max = 448.0f;

// One block of 128 threads per (padded row, k tile): amax of the tile, then scale and round.
__global__ void quantize_1x128_kernel(const float* x, int64_t rows, int64_t k, int64_t rows_padded, int64_t k_padded,
                                      __nv_fp8_storage_t* q, float* scales) {
  __shared__ float warp_max[4];
  const int64_t row = blockIdx.x, tile = blockIdx.y;
  const int64_t col = tile * 128 + threadIdx.x;
  const float v = (row < rows && col < k) ? x[row * k + col] : 0.0f;
  float m = fabsf(v);
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  const float amax = fmaxf(fmaxf(warp_max[0], warp_max[1]), fmaxf(warp_max[2], warp_max[3]));
  const float scale = amax > 0.0f ? amax / kFp8Max : 1.0f;
  q[row * k_padded + col] = __nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3);
  if (threadIdx.x == 0) scales[tile * rows_padded + row] = scale;
}

// 128x128-block scaled e4m3 → bf16, reading a [rows, cols] window of a weight stored with row
// stride w_ld and scales stored with row stride scales_ld (one row per 128 weight rows).
__global__ void dequantize_fp8_kernel(const __nv_fp8_storage_t* w, int64_t w_ld, const float* scales,
                                      int64_t scales_ld, int64_t rows, int64_t cols, __nv_bfloat16* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  const __half_raw h = __nv_cvt_fp8_to_halfraw(w[r * w_ld + c], __NV_E4M3);
  out[i] = __float2bfloat16_rn(__half2float(__half(h)) * scales[(r / 128) * scales_ld + c / 128]);
}

}  // namespace

void launch_quantize_fp8_1x128(const float* x, int64_t rows, int64_t k, int64_t rows_padded, int64_t k_padded,
                               uint8_t* q, float* scales, Stream stream) {
  DS_CHECK(k_padded % 128 == 0 && rows_padded >= rows && k_padded >= k);
  if (rows_padded == 0) return;
  const dim3 grid(static_cast<unsigned>(rows_padded), static_cast<unsigned>(k_padded / 128));
  quantize_1x128_kernel<<<grid, 128, 0, stream>>>(x, rows, k, rows_padded, k_padded, q, scales);
  DS_CUDA_CHECK_LAUNCH();
}

void launch_dequantize_fp8_to_bf16(const uint8_t* w, int64_t w_ld, const float* scales, int64_t scales_ld,
                                   int64_t rows, int64_t cols, uint16_t* out, Stream stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  dequantize_fp8_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      w, w_ld, scales, scales_ld, rows, cols, reinterpret_cast<__nv_bfloat16*>(out));
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
