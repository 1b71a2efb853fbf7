// DeepSeek's FP8 activations, one 128-column tile of a row per group of lanes: 32 lanes of four
// columns (the norms that write their rows in e4m3 themselves, cuda_elementwise.cu) or 16 lanes
// of eight (the quantising pass, fp8_quantize.cu). Lane l of a group holds columns
// kValuesPerLane l onward. Both give the same bits: the scale is the tile's largest magnitude,
// whichever lanes held which values.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "core/dtype.h"

namespace dsinfer::cuda {

// Runs body(divide), where divide(v) is v / scale rounded to nearest, as the IEEE division gives
// it, for a tile's values. From the scale's one reciprocal where it can: with inverse = 1/scale
// rounded to nearest (__frcp_rn), q = v inverse and the residual v - q scale (exact, an FMA),
// q + residual inverse is the quotient rounded to nearest (Markstein's theorem) as long as the
// residual does not underflow, which a scale of at least 2^-90 rules out for every quotient that
// e4m3 does not round to zero. Smaller scales take the division, a subroutine of some ten
// instructions a value. body's loop is compiled once for each.
template <typename Body>
__device__ __forceinline__ void with_e4m3_quotient(float scale, const Body& body) {
  if (scale >= 0x1p-90f) {
    const float inverse = __frcp_rn(scale);
    body([&](float v) {
      const float estimate = v * inverse;
      return fmaf(fmaf(-estimate, scale, v), inverse, estimate);
    });
  } else {
    body([&](float v) { return v / scale; });
  }
}

// The tile's e4m3 codes, four to a word, left in `words`, and its scale (quantize_tile_e4m3).
template <int kValuesPerLane>
__device__ __forceinline__ float quantize_tile_e4m3_words(const float (&v)[kValuesPerLane],
                                                          uint32_t (&words)[kValuesPerLane / 4]) {
  static_assert(kValuesPerLane == 4 || kValuesPerLane == 8, "a tile is 32 lanes of 4 or 16 lanes of 8");
  constexpr int kLanesPerTile = 128 / kValuesPerLane;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kValuesPerLane; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int step = kLanesPerTile / 2; step > 0; step /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, step));
  const float scale = e4m3_block_scale(amax);
  const auto encode = [&](auto divide) {
#pragma unroll
    for (int w = 0; w < kValuesPerLane / 4; ++w) {
      const float* p = v + 4 * w;
      const __nv_fp8x2_storage_t lo =
          __nv_cvt_float2_to_fp8x2(make_float2(divide(p[0]), divide(p[1])), __NV_SATFINITE, __NV_E4M3);
      const __nv_fp8x2_storage_t hi =
          __nv_cvt_float2_to_fp8x2(make_float2(divide(p[2]), divide(p[3])), __NV_SATFINITE, __NV_E4M3);
      words[w] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
  };
  with_e4m3_quotient(scale, encode);
  return scale;
}

// The tile's e4m3 codes (this lane's kValuesPerLane at q_lane, aligned to their size; none
// written where q_lane is null) under the tile's scale (its largest magnitude over 448), which is
// returned. Every lane of the warp calls it; a group is an aligned run of 128 / kValuesPerLane
// lanes.
template <int kValuesPerLane>
__device__ __forceinline__ float quantize_tile_e4m3(const float (&v)[kValuesPerLane], uint8_t* q_lane) {
  uint32_t words[kValuesPerLane / 4];
  const float scale = quantize_tile_e4m3_words(v, words);
  if (q_lane == nullptr) return scale;
  if constexpr (kValuesPerLane == 4) {
    *reinterpret_cast<uint32_t*>(q_lane) = words[0];
  } else {
    *reinterpret_cast<uint2*>(q_lane) = make_uint2(words[0], words[1]);
  }
  return scale;
}

// The quantising passes' blocks (fp8_quantize.cu, and SiLU·up written as e4m3 rows in
// cuda_elementwise.cu): 16 lanes of eight columns take a 128-column tile, a block one column
// tile of kQuantizeBlockRows rows, each thread two rows kQuantizeRowsAtOnce apart whose values
// are all in registers before either tile's maximum is needed (a pass that only moves bytes runs
// at the rate of the loads it keeps in flight); a block's scales are one contiguous run of the
// column-major scale array.
constexpr int kQuantizeThreads = 256;
constexpr int kQuantizeLanesPerTile = 16;
constexpr int kQuantizeRowsAtOnce = kQuantizeThreads / kQuantizeLanesPerTile;
constexpr int kQuantizeRowsPerThread = 2;
constexpr int kQuantizeBlockRows = kQuantizeRowsAtOnce * kQuantizeRowsPerThread;

// Blocks for rows_padded rows of k columns (k a multiple of 128).
inline int64_t quantize_num_blocks(int64_t rows_padded, int64_t k) {
  return (rows_padded + kQuantizeBlockRows - 1) / kQuantizeBlockRows * (k / 128);
}

// This thread's column tile, first row (the other is kQuantizeRowsAtOnce further) and first
// column. Consecutive blocks take the column tiles of the same rows, so a grid reads in order.
struct QuantizePlace {
  int64_t col_tile, row0, col;
};
__device__ __forceinline__ QuantizePlace quantize_place(int64_t k) {
  const int64_t tiles_per_row = k / 128;
  const int64_t col_tile = blockIdx.x % tiles_per_row;
  return {col_tile, (blockIdx.x / tiles_per_row) * kQuantizeBlockRows + threadIdx.x / kQuantizeLanesPerTile,
          col_tile * 128 + (threadIdx.x % kQuantizeLanesPerTile) * 8};
}

// The values of the thread's rows (each row's eight columns from at.col, by load(row, values)),
// zeros for rows at or past `rows` (padding, which quantises to zeros).
template <typename Load>
__device__ __forceinline__ void load_quantize_rows(const QuantizePlace& at, int64_t rows, const Load& load,
                                                   float (&v)[kQuantizeRowsPerThread][8]) {
#pragma unroll
  for (int i = 0; i < kQuantizeRowsPerThread; ++i) {
    const int64_t row = at.row0 + i * kQuantizeRowsAtOnce;
    if (row < rows) {
      load(row, v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[i][j] = 0.0f;
    }
  }
}

// The values of the thread's row i (0 or 1) to e4m3 codes in q [rows_padded, k] and its tile's
// scale in scales [k / 128][rows_padded]; a row at or past rows_padded takes part in the tile's
// shuffles and is not written.
__device__ __forceinline__ void store_e4m3_row(const QuantizePlace& at, int i, const float (&v)[8], int64_t k,
                                               int64_t rows_padded, uint8_t* q, float* scales) {
  const int64_t row = at.row0 + i * kQuantizeRowsAtOnce;
  const float scale = quantize_tile_e4m3(v, row < rows_padded ? q + row * k + at.col : nullptr);
  if (row < rows_padded && threadIdx.x % kQuantizeLanesPerTile == 0) scales[at.col_tile * rows_padded + row] = scale;
}

}  // namespace dsinfer::cuda
