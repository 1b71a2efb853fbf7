// DeepSeek's FP8 activations, one 128-column tile of a row per warp: lane l holds columns
// 4 l .. 4 l + 3. Shared by the quantising pass (fp8_quantize.cu) and the norms that write their
// rows in e4m3 themselves (cuda_elementwise.cu), so that both give the same bits.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "core/dtype.h"

namespace dsinfer::cuda {

// The tile's e4m3 codes (this lane's four at q_lane, 4-byte aligned) under the tile's scale
// (its largest magnitude over 448), which is returned. Every lane of the warp calls it.
__device__ __forceinline__ float quantize_tile_e4m3(const float (&v)[4], uint8_t* q_lane) {
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  for (int step = 16; step > 0; step /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, step));
  const float scale = e4m3_block_scale(amax);
  const __nv_fp8x2_storage_t pair_lo = __nv_cvt_float2_to_fp8x2(make_float2(v[0] / scale, v[1] / scale),
                                                                __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t pair_hi = __nv_cvt_float2_to_fp8x2(make_float2(v[2] / scale, v[3] / scale),
                                                                __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint32_t*>(q_lane) = static_cast<uint32_t>(pair_lo) | (static_cast<uint32_t>(pair_hi) << 16);
  return scale;
}

}  // namespace dsinfer::cuda
