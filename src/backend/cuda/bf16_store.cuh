// Stores of fp32 values as bf16, for kernels that also write their output's bf16 copy (the
// input of the product that follows).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace dsinfer::cuda {

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
