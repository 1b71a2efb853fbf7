#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace dsinfer {
namespace {

TEST(DType, Bf16RoundTripsAndRoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

TEST(DType, F16MatchesKnownEncodings) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1000, 1000);
  for (int i = 0; i < 10000; ++i) {
    const float x = dist(rng);
    const float y = f16_to_f32(f32_to_f16(x));
    EXPECT_NEAR(y, x, std::fabs(x) * 0.0005f + 1e-7f);
    EXPECT_EQ(f32_to_f16(y), f32_to_f16(x));
  }
}

TEST(DType, Fp8E4M3TableAndRounding) {
  EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
  EXPECT_EQ(f32_to_fp8e4m3(1000.0f), 0x7e);   // saturates
  EXPECT_EQ(f32_to_fp8e4m3(-1000.0f), 0xfe);
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    const float v = fp8e4m3_to_f32(static_cast<uint8_t>(b));
    if (v == 0.0f) continue;
    EXPECT_EQ(f32_to_fp8e4m3(v), b) << b;
  }
  // 1.0625 lies halfway between 1.0 (0x38, even) and 1.125 (0x39): ties to even.
  EXPECT_EQ(f32_to_fp8e4m3(1.0625f), 0x38);
  EXPECT_EQ(f32_to_fp8e4m3(1.07f), 0x39);
}

TEST(DType, Fp8E4M3RoundsToTheNearestCodeEverywhere) {
  // Against a search of the code table: every midpoint between neighbouring codes and the floats
  // just beside it (ties go to the even code), and a dense sweep of [0, 480) with both signs.
  auto nearest = [](float x) {
    const float a = std::fabs(x);
    int best = 0;
    for (int c = 1; c <= 0x7e; ++c) {
      const float d = std::fabs(fp8e4m3_to_f32(static_cast<uint8_t>(c)) - a);
      const float d_best = std::fabs(fp8e4m3_to_f32(static_cast<uint8_t>(best)) - a);
      if (d < d_best || (d == d_best && c % 2 == 0)) best = c;
    }
    return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | best);
  };
  std::vector<float> xs;
  for (int c = 0; c < 0x7e; ++c) {
    const float mid = (fp8e4m3_to_f32(static_cast<uint8_t>(c)) + fp8e4m3_to_f32(static_cast<uint8_t>(c + 1))) / 2;
    xs.insert(xs.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)});
  }
  for (float x = 0.0f; x < 480.0f; x = x * 1.0007f + 1e-6f) xs.push_back(x);
  for (float x : xs) {
    const uint8_t want = x >= 448.0f ? 0x7e : nearest(x);
    ASSERT_EQ(f32_to_fp8e4m3(x), want) << x;
    ASSERT_EQ(f32_to_fp8e4m3(-x), want | 0x80) << -x;
  }
}

TEST(DType, ParseNames) {
  DType d;
  ASSERT_TRUE(parse_dtype("F8_E4M3", &d));
  EXPECT_EQ(d, DType::kF8E4M3);
  EXPECT_EQ(dtype_size_bytes(d), 1u);
  EXPECT_FALSE(parse_dtype("F8_E5M2X", &d));
}

}  // namespace
}  // namespace dsinfer
