#include "core/dtype.h"

#include <array>
#include <cmath>
#include <cstring>

#include "core/check.h"

namespace dsinfer {

size_t dtype_size_bytes(DType dtype) {
  switch (dtype) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: return 2;
    case DType::kF8E4M3: case DType::kI8: case DType::kU8: case DType::kBool: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF64: return "F64";
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

bool parse_dtype(std::string_view name, DType* out) {
  static const std::pair<std::string_view, DType> kNames[] = {
      {"F64", DType::kF64}, {"F32", DType::kF32},  {"F16", DType::kF16},
      {"BF16", DType::kBF16}, {"F8_E4M3", DType::kF8E4M3}, {"I64", DType::kI64},
      {"I32", DType::kI32}, {"I16", DType::kI16}, {"I8", DType::kI8},
      {"U8", DType::kU8}, {"BOOL", DType::kBool}};
  for (const auto& [n, d] : kNames) {
    if (n == name) {
      *out = d;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: value = mant * 2^-24
      float f = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity
  if (a < 6.103515625e-05f) {               // subnormal range: multiples of 2^-24
    const float scaled = a * 16777216.0f;    // exact
    const uint16_t m = static_cast<uint16_t>(std::nearbyint(scaled));  // RNE (default mode)
    return sign | m;
  }
  uint32_t abs_u = u & 0x7fffffffu;
  // Rebias exponent and round the mantissa to 10 bits, nearest even.
  uint32_t rounded = abs_u + 0xfffu + ((abs_u >> 13) & 1u);
  return sign | static_cast<uint16_t>(((rounded >> 13) - (112u << 10)) & 0x7fffu);
}

namespace {
std::array<float, 256> make_fp8_table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) {
    const int sign = b >> 7;
    const int exp = (b >> 3) & 0xf;
    const int mant = b & 0x7;
    float v;
    if (exp == 0xf && mant == 0x7) {
      v = std::nanf("");
    } else if (exp == 0) {
      v = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
    } else {
      v = std::ldexp(1.0f + mant / 8.0f, exp - 7);
    }
    t[b] = sign ? -v : v;
  }
  return t;
}
const std::array<float, 256> kFp8Table = make_fp8_table();
}  // namespace

float fp8e4m3_to_f32(uint8_t bits) { return kFp8Table[bits]; }

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  // Below 2^-6 the codes are the multiples of 2^-9 (subnormals, and 2^-6 itself as code 8): round
  // a · 2^9 to an integer, ties to even (the default rounding mode).
  if (a < 0x1p-6f) return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  // Normal codes are the float's exponent (rebiased by 127 - 7) and its top three mantissa bits:
  // round the 20 bits below them to nearest, ties to the even code, and let a carry move the
  // exponent. Below 448 the result stays at or under code 0x7e (448 itself).
  uint32_t bits = 0;
  std::memcpy(&bits, &a, 4);
  bits += 0x7ffffu + ((bits >> 20) & 1u);
  return sign | static_cast<uint8_t>((bits >> 20) - (120u << 3));
}

void convert_to_f32(DType dtype, const void* src, float* dst, size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = kFp8Table[s[i]];
      return;
    }
    case DType::kF64: {
      const auto* s = static_cast<const double*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    default:
      DS_CHECK_MSG(false, "convert_to_f32: not a float dtype: " << dtype_name(dtype));
  }
}

}  // namespace dsinfer
