#include "backend/latent_cache_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace dsinfer {

const char* kv_cache_format_name(KvCacheFormat format) { return format == KvCacheFormat::kFp8 ? "fp8" : "fp32"; }

bool parse_kv_cache_format(std::string_view name, KvCacheFormat* out) {
  if (name == "fp32") *out = KvCacheFormat::kF32;
  else if (name == "fp8") *out = KvCacheFormat::kFp8;
  else return false;
  return true;
}

size_t latent_entry_bytes(KvCacheFormat format, int lora, int rope) {
  if (format == KvCacheFormat::kFp8) return static_cast<size_t>(Fp8LatentLayout{lora, rope}.entry_bytes());
  return static_cast<size_t>(lora + rope) * sizeof(float);
}

void quantize_latent_entry(const float* entry, int lora, int rope, uint8_t* dst) {
  const Fp8LatentLayout layout{lora, rope};
  std::memset(dst, 0, static_cast<size_t>(layout.entry_bytes()));
  for (int tile = 0; tile < layout.num_scales(); ++tile) {
    const int begin = tile * Fp8LatentLayout::kTileColumns;
    const int end = std::min(lora, begin + Fp8LatentLayout::kTileColumns);
    float amax = 0.0f;
    for (int c = begin; c < end; ++c) amax = std::max(amax, std::fabs(entry[c]));
    const float scale = e4m3_block_scale(amax);
    for (int c = begin; c < end; ++c) dst[c] = f32_to_fp8e4m3(entry[c] / scale);
    std::memcpy(dst + layout.scales_offset() + 4 * tile, &scale, 4);
  }
  for (int r = 0; r < rope; ++r) {
    const uint16_t bits = f32_to_bf16(entry[lora + r]);
    std::memcpy(dst + layout.rope_offset() + 2 * r, &bits, 2);
  }
}

void dequantize_latent_entry(const uint8_t* src, int lora, int rope, float* entry) {
  const Fp8LatentLayout layout{lora, rope};
  for (int c = 0; c < lora; ++c) {
    float scale;
    std::memcpy(&scale, src + layout.scales_offset() + 4 * (c / Fp8LatentLayout::kTileColumns), 4);
    entry[c] = fp8e4m3_to_f32(src[c]) * scale;
  }
  for (int r = 0; r < rope; ++r) {
    uint16_t bits;
    std::memcpy(&bits, src + layout.rope_offset() + 2 * r, 2);
    entry[lora + r] = bf16_to_f32(bits);
  }
}

}  // namespace dsinfer
