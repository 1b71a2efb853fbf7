// Activations to DeepSeek's FP8 format on the fly: each row's 128-column tiles get one fp32
// scale (the tile's largest magnitude over 448, e4m3's largest finite value), so every tile
// uses e4m3's whole range whatever the spread between tiles.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/fp8_quantize.cuh"
#include "backend/cuda/kernel_launch.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kTileColumns = 128;
constexpr int kLanesPerTile = 16;  // eight columns a lane: one 16-byte load, one 8-byte store
constexpr int kThreads = 256;
constexpr int kTilesAtOnce = kThreads / kLanesPerTile;
// A block quantises one column tile of kBlockRows rows, each thread two rows kTilesAtOnce
// apart: both loads are in flight before either tile's maximum is needed (a pass that only
// moves bytes runs at the rate of the loads it keeps in flight), and the block's scales are one
// contiguous run of the column-major scale array.
constexpr int kRowsPerThread = 2;
constexpr int kBlockRows = kTilesAtOnce * kRowsPerThread;

// Eight values of a row from 16-byte aligned memory: bf16 as they are, fp32 rounded to bf16 first
// (as launch_f32_to_bf16_padded rounds), so both give the bits of the bf16 rows.
__device__ __forceinline__ void load_row_values(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[w]));
    v[2 * w] = pair.x;
    v[2 * w + 1] = pair.y;
  }
}
__device__ __forceinline__ void load_row_values(const float* p, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  const float raw[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(__float2bfloat16_rn(raw[i]));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_rows_e4m3_kernel(const T* x, int64_t rows, int64_t k, int64_t rows_padded, uint8_t* q, float* scales) {
  await_previous_kernels();
  // Consecutive blocks take the column tiles of the same rows, so the grid reads x in order.
  const int64_t tiles_per_row = k / kTileColumns;
  const int64_t col_tile = blockIdx.x % tiles_per_row;
  const int64_t row0 = (blockIdx.x / tiles_per_row) * kBlockRows + threadIdx.x / kLanesPerTile;
  const int64_t col = col_tile * kTileColumns + (threadIdx.x % kLanesPerTile) * 8;
  float v[kRowsPerThread][8];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t row = row0 + i * kTilesAtOnce;
    if (row < rows) {
      load_row_values(x + row * k + col, v[i]);
    } else {  // rows past `rows` (padding) quantise to zeros
#pragma unroll
      for (int j = 0; j < 8; ++j) v[i][j] = 0.0f;
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t row = row0 + i * kTilesAtOnce;
    // Every lane takes part in the tile's shuffles; only rows of the padded array are written.
    const float scale = quantize_tile_e4m3(v[i], row < rows_padded ? q + row * k + col : nullptr);
    if (row < rows_padded && threadIdx.x % kLanesPerTile == 0) scales[col_tile * rows_padded + row] = scale;
  }
}

}  // namespace

namespace {
template <typename T>
void launch_quantize(const T* x, int64_t rows, int64_t k, int64_t rows_padded, uint8_t* q, float* scales,
                     Stream stream) {
  DS_CHECK(k % kTileColumns == 0 && rows_padded >= rows);
  DS_CHECK_MSG(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0,
               "quantize_rows_e4m3: input rows 16-byte aligned and e4m3 rows 8-byte aligned");
  const int64_t num_blocks = (rows_padded + kBlockRows - 1) / kBlockRows * (k / kTileColumns);
  if (num_blocks == 0) return;
  launch_kernel(quantize_rows_e4m3_kernel<T>, static_cast<unsigned>(num_blocks), kThreads, 0, stream, x, rows, k,
                rows_padded, q, scales);
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
