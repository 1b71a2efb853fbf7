#include "model/weights_fp8.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"

namespace dsinfer {
namespace {

TEST(WeightsFp8Test, EachBlockUsesItsOwnScale) {
  // 3x5 weights in 2x2 blocks: scales [2, 3], partial blocks on both edges.
  const int64_t rows = 3, cols = 5;
  std::vector<uint8_t> w(rows * cols);
  std::vector<float> expected_codes(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float v = static_cast<float>(i % 7) - 3.0f;  // small integers are exact in e4m3
    w[i] = f32_to_fp8e4m3(v);
    expected_codes[i] = v;
  }
  const std::vector<float> scale = {1.0f, 2.0f, 4.0f, 0.5f, 0.25f, 8.0f};
  std::vector<float> out(rows * cols, -1.0f);
  dequantize_fp8_block(w.data(), scale.data(), rows, cols, 2, 2, out.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float s = scale[(r / 2) * 3 + c / 2];
      EXPECT_EQ(out[r * cols + c], expected_codes[r * cols + c] * s) << r << "," << c;
    }
  }
}

TEST(WeightsFp8Test, MatchesScalarReferenceOn128Blocks) {
  const int64_t rows = 200, cols = 300;
  std::mt19937 rng(7);
  std::vector<uint8_t> w(rows * cols);
  for (auto& b : w) {
    b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) == 0x7f) b = 0;  // skip NaN codes so equality is meaningful
  }
  std::vector<float> scale(2 * 3);
  for (auto& s : scale) s = std::ldexp(1.0f + static_cast<float>(rng() % 100) / 100.0f, -8);
  std::vector<float> out(rows * cols);
  dequantize_fp8_block(w.data(), scale.data(), rows, cols, 128, 128, out.data());
  for (int64_t r = 0; r < rows; r += 7) {
    for (int64_t c = 0; c < cols; c += 3) {
      EXPECT_EQ(out[r * cols + c], fp8e4m3_to_f32(w[r * cols + c]) * scale[(r / 128) * 3 + c / 128]);
    }
  }
  EXPECT_EQ(out[199 * cols + 299], fp8e4m3_to_f32(w[199 * cols + 299]) * scale[1 * 3 + 2]);
}

}  // namespace
}  // namespace dsinfer
