// Activations to DeepSeek's FP8 format on the fly: each row's 128-column tiles get one fp32
// scale (the tile's largest magnitude over 448, e4m3's largest finite value), so every tile
// uses e4m3's whole range whatever the spread between tiles.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/bf16_store.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/fp8_quantize.cuh"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/vector_load.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kTileColumns = 128;

// Eight values of a row: bf16 as they are, fp32 rounded to bf16 first (as
// launch_f32_to_bf16_padded rounds), so both give the bits of the bf16 rows.
__device__ __forceinline__ void load_row_values(const __nv_bfloat16* p, float (&v)[8]) { load8(p, v); }
__device__ __forceinline__ void load_row_values(const float* p, float (&v)[8]) {
  load8(p, v);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = round_to_bf16(v[i]);
}

template <typename T>
__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_rows_e4m3_kernel(const T* x, int64_t rows, int64_t k, int64_t rows_padded, uint8_t* q, float* scales) {
  await_previous_kernels();
  const QuantizePlace at = quantize_place(k);
  float v[kQuantizeRowsPerThread][8];
  load_quantize_rows(at, rows, [&](int64_t row, float(&values)[8]) { load_row_values(x + row * k + at.col, values); },
                     v);
#pragma unroll
  for (int i = 0; i < kQuantizeRowsPerThread; ++i) store_e4m3_row(at, i, v[i], k, rows_padded, q, scales);
}

}  // namespace

namespace {
template <typename T>
void launch_quantize(const T* x, int64_t rows, int64_t k, int64_t rows_padded, uint8_t* q, float* scales,
                     Stream stream) {
  DS_CHECK(k % kTileColumns == 0 && rows_padded >= rows);
  DS_CHECK_MSG(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0,
               "quantize_rows_e4m3: input rows 16-byte aligned and e4m3 rows 8-byte aligned");
  const int64_t num_blocks = quantize_num_blocks(rows_padded, k);
  if (num_blocks == 0) return;
  launch_kernel(quantize_rows_e4m3_kernel<T>, static_cast<unsigned>(num_blocks), kQuantizeThreads, 0, stream, x, rows,
                k, rows_padded, q, scales);
  DS_CUDA_CHECK_LAUNCH();
}
}  // namespace

void launch_quantize_rows_e4m3(const uint16_t* x, int64_t rows, int64_t k, int64_t rows_padded, uint8_t* q,
                               float* scales, Stream stream) {
  launch_quantize(reinterpret_cast<const __nv_bfloat16*>(x), rows, k, rows_padded, q, scales, stream);
}

void launch_quantize_rows_f32_e4m3(const float* x, int64_t rows, int64_t k, int64_t rows_padded, uint8_t* q,
                                   float* scales, Stream stream) {
  launch_quantize(x, rows, k, rows_padded, q, scales, stream);
}

}  // namespace dsinfer::cuda
