// Element types of checkpoints and activations, and exact conversions to and from fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/host_device.h"

namespace dsinfer {

enum class DType { kF32, kF16, kBF16, kF8E4M3, kI64, kI32, kI16, kI8, kU8, kBool, kF64 };

size_t dtype_size_bytes(DType dtype);
const char* dtype_name(DType dtype);  // safetensors spelling: "F32", "BF16", "F8_E4M3", ...
// Parses the safetensors spelling; returns false for unknown names.
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// f rounded to the nearest bf16, as fp32.
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float f);
// f rounded to the nearest f16, as fp32.
inline float round_to_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

// OCP fp8 e4m3 ("e4m3fn"): no infinities, 0x7f/0xff are NaN, max finite 448.
float fp8e4m3_to_f32(uint8_t bits);
// Round to nearest even, saturating to ±448 (the convention of DeepSeek's quantisers).
uint8_t f32_to_fp8e4m3(float f);

// The scale that maps a block of values whose largest magnitude is amax onto e4m3's whole range
// (DeepSeek's weights, activations and FP8 latent cache alike): amax / 448, and 1 for an
// all-zero block, whose codes are zeros either way. Host and device code share it.
DS_HOST_DEVICE inline float e4m3_block_scale(float amax) {
  return amax > 0.0f ? amax / 448.0f : 1.0f;
}

// Widens n elements of `dtype` at `src` into fp32 `dst`. dtype must be a float type.
void convert_to_f32(DType dtype, const void* src, float* dst, size_t n);

}  // namespace dsinfer
