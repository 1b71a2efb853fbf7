// fp32 values as bf16: stores, for kernels that also write their output's bf16 copy (the input
// of the product that follows), and the rounding itself, for kernels that quantise the values a
// bf16 copy would hold; and SiLU·up for outputs rounded to bf16.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace dsinfer::cuda {

// The value a bf16 store of v keeps (round to nearest even).
__device__ __forceinline__ float round_to_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// SiLU(g) · u for outputs rounded to bf16: the fast exponential and division (a few instructions
// where expf and an IEEE division take dozens) err by a few fp32 ulps, far below bf16's step.
// With the exact forms the one-pass e4m3 SiLU·up (cuda_elementwise.cu), which also divides by
// each tile's scale, was bound by instructions: 2.2 TB/s, 103 µs for 16,384 rows × 2,816 on an
// H200; 86 µs with these; and the prefill expert blocks' epilogue was a fifth of a math warp's
// time.
__device__ __forceinline__ float silu_times(float g, float u) { return __fdividef(g, 1.0f + __expf(-g)) * u; }

// Four floats as four bf16 (round to nearest even, as the conversion kernel rounds), 8 bytes
// at dst (8-byte aligned).
__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* dst, float4 v) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 packed;
  packed.x = *reinterpret_cast<const uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(dst) = packed;
}

}  // namespace dsinfer::cuda
