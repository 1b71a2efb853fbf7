// The FP8 latent cache (latent_cache_format.h): the entry's byte layout and quantisation, and
// the whole forward on the CPU with it against the HF reference fixtures (computed with an
// fp32 cache, so FP8 may move near-tied logits but not clear ones).
#include <gtest/gtest.h>
#include "teacher_forcing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>

#include "backend/backend.h"
#include "backend/latent_cache_format.h"
#include "core/dtype.h"
#include "model/deepseek_model.h"

namespace dsinfer {
namespace {

TEST(Fp8LatentCache, EntryLayoutOfDeepSeekShapes) {
  // 512 e4m3 + 4 fp32 scales + 64 bf16: FlashMLA's 656-byte entry.
  EXPECT_EQ(latent_entry_bytes(KvCacheFormat::kFp8, 512, 64), 656u);
  EXPECT_EQ(latent_entry_bytes(KvCacheFormat::kF32, 512, 64), 2304u);
  const Fp8LatentLayout layout{512, 64};
  EXPECT_EQ(layout.num_scales(), 4);
  EXPECT_EQ(layout.scales_offset(), 512);
  EXPECT_EQ(layout.rope_offset(), 528);
  // A latent width off the 128-column grid: a partial last tile, parts still on 16 bytes.
  const Fp8LatentLayout tiny{200, 16};
  EXPECT_EQ(tiny.num_scales(), 2);
  EXPECT_EQ(tiny.scales_offset(), 208);
  EXPECT_EQ(tiny.rope_offset(), 224);
  EXPECT_EQ(tiny.entry_bytes(), 256);
  KvCacheFormat f;
  EXPECT_TRUE(parse_kv_cache_format("fp8", &f));
  EXPECT_EQ(f, KvCacheFormat::kFp8);
  EXPECT_FALSE(parse_kv_cache_format("int4", &f));
}

TEST(Fp8LatentCache, EachTileKeepsItsOwnRange) {
  const int lora = 300, rope = 16;
  std::vector<float> entry(lora + rope);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  // Tiles of very different magnitudes, and one all zero.
  for (int c = 0; c < lora; ++c) entry[c] = normal(rng) * (c < 128 ? 1e-3f : c < 256 ? 0.0f : 40.0f);
  for (int r = 0; r < rope; ++r) entry[lora + r] = normal(rng);
  std::vector<uint8_t> bytes(latent_entry_bytes(KvCacheFormat::kFp8, lora, rope));
  quantize_latent_entry(entry.data(), lora, rope, bytes.data());
  std::vector<float> back(entry.size());
  dequantize_latent_entry(bytes.data(), lora, rope, back.data());
  const Fp8LatentLayout layout{lora, rope};
  for (int tile = 0; tile < 3; ++tile) {
    const int begin = tile * 128, end = std::min(lora, begin + 128);
    float amax = 0;
    for (int c = begin; c < end; ++c) amax = std::max(amax, std::fabs(entry[c]));
    float scale;
    std::memcpy(&scale, bytes.data() + layout.scales_offset() + 4 * tile, 4);
    EXPECT_EQ(scale, amax > 0 ? amax / 448.0f : 1.0f) << "tile " << tile;
    for (int c = begin; c < end; ++c) {
      // e4m3 keeps 3 mantissa bits: within half a step of 2^-3 relative, or of the smallest
      // subnormal step (2^-9 of the scale) near zero.
      const float tol = std::max(std::fabs(entry[c]) * 0.0625f, scale * 0.002f);
      EXPECT_NEAR(back[c], entry[c], tol) << "column " << c;
    }
  }
  // The tile's largest magnitude is exact (it maps to 448), the rope part is bf16.
  const int big = static_cast<int>(std::max_element(entry.begin() + 256, entry.begin() + lora,
                                                    [](float a, float b) { return std::fabs(a) < std::fabs(b); }) -
                                   entry.begin());
  EXPECT_FLOAT_EQ(back[big], entry[big]);
  for (int r = 0; r < rope; ++r) EXPECT_EQ(back[lora + r], bf16_to_f32(f32_to_bf16(entry[lora + r])));
}

// Teacher-forced greedy decoding of every fixture prompt through an FP8 cache on the CPU: nearly
// all steps whose reference top-2 margin is clear agree with the reference, and most others.
class Fp8CacheGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8CacheGoldenTest, FollowsTheReferenceOnClearSteps) {
  const std::string dir = std::string(DSINFER_SOURCE_DIR) + "/tests/data/" + GetParam();
  auto backend = make_backend("cpu");
  auto model = load_deepseek_model(dir, *backend, 0, false);
  ASSERT_EQ(model->allocate_caches(1, 64, KvCacheFormat::kFp8).layers[0].data.dtype, DType::kU8);
  const testing::TeacherForcedAgreement a = testing::teacher_forced_agreement(*model, dir, 0.2, KvCacheFormat::kFp8);
  std::cout << GetParam() << " with an FP8 latent cache: top-1 agreement " << a.num_agree << "/" << a.num_steps
            << " (clear margins " << a.num_clear_agree << "/" << a.num_clear << ")\n";
  // e4m3 keeps 3 mantissa bits of each latent value (about 6% rounding), while these random
  // fixtures' clear margins start at 0.2 on a logit scale of about 4 (5%): a few clear steps may
  // flip. Measured: tiny_v3 136/144 (clear 73/75), tiny_v2_lite 137/144 (84/84), tiny_v3_fp8
  // 136/144 (82/85); 144/144 on each with the fp32 cache. A broken quantiser falls far below.
  EXPECT_GT(a.num_clear, 60);
  EXPECT_GE(a.num_clear_agree, 0.95 * a.num_clear) << GetParam();
  EXPECT_GE(a.num_agree, 0.90 * a.num_steps) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8CacheGoldenTest, ::testing::Values("tiny_v3", "tiny_v2_lite", "tiny_v3_fp8"));

}  // namespace
}  // namespace dsinfer
