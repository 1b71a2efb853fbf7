// Device reads and writes of one latent cache entry in either format (latent_cache_format.h):
// fp32 [lora | rope], or FP8 (e4m3 latent, an fp32 scale per 128 columns, bf16 rope) at the
// byte offsets MlaDims carries.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {

constexpr int kFp8TileColumns = 128;  // latent columns per scale

__device__ __forceinline__ const uint8_t* cache_entry(const MlaDims& d, const void* cache, int64_t slot) {
  return static_cast<const uint8_t*>(cache) + slot * d.cache_entry_bytes;
}

__device__ __forceinline__ float fp8_to_float(uint8_t bits) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(bits), __NV_E4M3)));
}

// Latent column c (< kv_lora_rank) of an entry.
__device__ __forceinline__ float latent_value(const MlaDims& d, const uint8_t* entry, int c) {
  if (!d.cache_fp8) return reinterpret_cast<const float*>(entry)[c];
  const float scale = reinterpret_cast<const float*>(entry + d.cache_scales_offset)[c / kFp8TileColumns];
  return fp8_to_float(entry[c]) * scale;
}

// Rope column r (< qk_rope_head_dim) of an entry.
__device__ __forceinline__ float rope_value(const MlaDims& d, const uint8_t* entry, int r) {
  if (!d.cache_fp8) return reinterpret_cast<const float*>(entry)[d.kv_lora_rank + r];
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(entry + d.cache_rope_offset)[r]);
}

}  // namespace dsinfer::cuda
