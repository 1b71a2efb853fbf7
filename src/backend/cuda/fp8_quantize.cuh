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

// The tile's e4m3 codes (this lane's kValuesPerLane at q_lane, aligned to their size; none
// written where q_lane is null) under the tile's scale (its largest magnitude over 448), which is
// returned. Every lane of the warp calls it; a group is an aligned run of 128 / kValuesPerLane
// lanes.
template <int kValuesPerLane>
__device__ __forceinline__ float quantize_tile_e4m3(const float (&v)[kValuesPerLane], uint8_t* q_lane) {
  static_assert(kValuesPerLane == 4 || kValuesPerLane == 8, "a tile is 32 lanes of 4 or 16 lanes of 8");
  constexpr int kLanesPerTile = 128 / kValuesPerLane;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kValuesPerLane; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int step = kLanesPerTile / 2; step > 0; step /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, step));
  const float scale = e4m3_block_scale(amax);
  uint32_t words[kValuesPerLane / 4];
#pragma unroll
  for (int w = 0; w < kValuesPerLane / 4; ++w) {
    const float* p = v + 4 * w;
    const __nv_fp8x2_storage_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(p[0] / scale, p[1] / scale), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(p[2] / scale, p[3] / scale), __NV_SATFINITE, __NV_E4M3);
    words[w] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  if (q_lane == nullptr) return scale;
  if constexpr (kValuesPerLane == 4) {
    *reinterpret_cast<uint32_t*>(q_lane) = words[0];
  } else {
    *reinterpret_cast<uint2*>(q_lane) = make_uint2(words[0], words[1]);
  }
  return scale;
}

}  // namespace dsinfer::cuda
