// How the paged latent cache stores one position's entry: the normalised c_kv (kv_lora_rank)
// and the rotated k_rope (rope_dim) of one token of one layer.
//
// - kF32: [lora + rope] fp32, 2,304 bytes for V2/V3 shapes.
// - kFp8: 656 bytes for V2/V3 shapes (DeepSeek's FP8 latent cache, as FlashMLA stores it):
//     [lora e4m3 | one fp32 scale per 128 latent columns | rope bf16],
//   each part starting on 16 bytes. A tile's scale is its largest magnitude over 448 (e4m3's
//   largest finite value), so each tile uses e4m3's whole range; the rope part stays bf16
//   because positions are encoded in its low bits. Quantisation happens once, when a token is
//   written; attention reads the dequantised values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace dsinfer {

enum class KvCacheFormat { kF32, kFp8 };

const char* kv_cache_format_name(KvCacheFormat format);  // "fp32", "fp8"
bool parse_kv_cache_format(std::string_view name, KvCacheFormat* out);

// Byte layout of one kFp8 entry.
struct Fp8LatentLayout {
  static constexpr int kTileColumns = 128;  // latent columns per scale
  int lora = 0, rope = 0;
  int num_scales() const { return (lora + kTileColumns - 1) / kTileColumns; }
  int scales_offset() const { return round16(lora); }
  int rope_offset() const { return scales_offset() + round16(4 * num_scales()); }
  int entry_bytes() const { return rope_offset() + round16(2 * rope); }

 private:
  static int round16(int v) { return (v + 15) / 16 * 16; }
};

// Bytes of one position's entry in `format`.
size_t latent_entry_bytes(KvCacheFormat format, int lora, int rope);
// The element type of a cache tensor in `format` (kF32, or kU8 for the bytes of FP8 entries).
inline DType latent_cache_dtype(KvCacheFormat format) {
  return format == KvCacheFormat::kFp8 ? DType::kU8 : DType::kF32;
}

// One kFp8 entry from fp32 [lora | rope], and back.
void quantize_latent_entry(const float* entry, int lora, int rope, uint8_t* dst);
void dequantize_latent_entry(const uint8_t* src, int lora, int rope, float* entry);

}  // namespace dsinfer
