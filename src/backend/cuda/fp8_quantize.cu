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
constexpr int kWarpsPerBlock = 8;

// One warp per (row, tile): four columns per lane.
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    quantize_rows_e4m3_kernel(const __nv_bfloat16* x, int64_t rows, int64_t k, int64_t rows_padded, uint8_t* q,
                              float* scales) {
  await_previous_kernels();
  const int64_t tiles_per_row = k / kTileColumns;
  const int64_t tile = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (tile >= rows_padded * tiles_per_row) return;
  const int64_t row = tile / tiles_per_row, col_tile = tile % tiles_per_row;
  const int lane = threadIdx.x % 32;
  const int64_t offset = row * k + col_tile * kTileColumns + lane * 4;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (row < rows) {
    const uint2 raw = *reinterpret_cast<const uint2*>(x + offset);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
  }
  const float scale = quantize_tile_e4m3(v, q + offset);
  if (lane == 0) scales[col_tile * rows_padded + row] = scale;
}

}  // namespace

void launch_quantize_rows_e4m3(const uint16_t* x, int64_t rows, int64_t k, int64_t rows_padded, uint8_t* q,
                               float* scales, Stream stream) {
  DS_CHECK(k % kTileColumns == 0 && rows_padded >= rows);
  const int64_t tiles = rows_padded * (k / kTileColumns);
  if (tiles == 0) return;
  launch_kernel(quantize_rows_e4m3_kernel, static_cast<unsigned>((tiles + kWarpsPerBlock - 1) / kWarpsPerBlock),
                kWarpsPerBlock * 32, 0, stream, reinterpret_cast<const __nv_bfloat16*>(x), rows, k, rows_padded, q,
                scales);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
