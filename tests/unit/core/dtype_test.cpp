#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

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

TEST(DType, ParseNames) {
  DType d;
  ASSERT_TRUE(parse_dtype("F8_E4M3", &d));
  EXPECT_EQ(d, DType::kF8E4M3);
  EXPECT_EQ(dtype_size_bytes(d), 1u);
  EXPECT_FALSE(parse_dtype("F8_E5M2X", &d));
}

}  // namespace
}  // namespace dsinfer
