// The pass that quantises bf16 activation rows to DeepSeek's FP8 format: every code and every
// scale against the host's quantiser, bit for bit, at row counts that leave part-filled blocks,
// with padding rows (zeros, scale 1), an all-zero tile and tiles of very different magnitudes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace dsinfer {
namespace {

using testing_cuda::random_values;

struct QuantiseCase {
  int64_t rows, rows_padded, k;
};

class CudaFp8QuantizeTest : public ::testing::TestWithParam<QuantiseCase> {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

// Device buffers of one case, freed on every path out of the test.
struct DeviceBuffers {
  void* x = nullptr;
  void* q = nullptr;
  void* scales = nullptr;
  ~DeviceBuffers() {
    cudaFree(x);
    cudaFree(q);
    cudaFree(scales);
  }
};

TEST_P(CudaFp8QuantizeTest, CodesAndScalesMatchTheHostBitForBit) {
  const QuantiseCase c = GetParam();
  const int64_t tiles = c.k / 128;
  // Row r's values scaled by 2^(r % 7 - 3) and tile t's by 4^t: tiles of one row and rows of one
  // tile get scales far apart. Row 1's second tile is all zeros (scale 1, zero codes).
  const auto values = random_values(c.rows * c.k, 91);
  std::vector<uint16_t> x(c.rows * c.k);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t col = 0; col < c.k; ++col) {
      const float v = values[r * c.k + col] * std::ldexp(1.0f, static_cast<int>(r % 7) - 3 + 2 * (col / 128 % 3));
      x[r * c.k + col] = f32_to_bf16(r == 1 && col / 128 == 1 ? 0.0f : v);
    }

  std::vector<uint8_t> want_q(c.rows_padded * c.k, 0);
  std::vector<float> want_scales(tiles * c.rows_padded, 1.0f);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t t = 0; t < tiles; ++t) {
      float amax = 0.0f;
      for (int64_t col = t * 128; col < (t + 1) * 128; ++col)
        amax = std::max(amax, std::abs(bf16_to_f32(x[r * c.k + col])));
      const float scale = e4m3_block_scale(amax);
      want_scales[t * c.rows_padded + r] = scale;
      for (int64_t col = t * 128; col < (t + 1) * 128; ++col)
        want_q[r * c.k + col] = f32_to_fp8e4m3(bf16_to_f32(x[r * c.k + col]) / scale);
    }

  DeviceBuffers d;
  ASSERT_EQ(cudaMalloc(&d.x, x.size() * sizeof(uint16_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d.q, want_q.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d.scales, want_scales.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d.x, x.data(), x.size() * sizeof(uint16_t), cudaMemcpyHostToDevice), cudaSuccess);
  // Garbage where the pass must write: padding rows included.
  ASSERT_EQ(cudaMemset(d.q, 0x7e, want_q.size()), cudaSuccess);
  ASSERT_EQ(cudaMemset(d.scales, 0x7f, want_scales.size() * sizeof(float)), cudaSuccess);
  cuda::launch_quantize_rows_e4m3(static_cast<uint16_t*>(d.x), c.rows, c.k, c.rows_padded,
                                  static_cast<uint8_t*>(d.q), static_cast<float*>(d.scales), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> got_q(want_q.size());
  std::vector<float> got_scales(want_scales.size());
  ASSERT_EQ(cudaMemcpy(got_q.data(), d.q, got_q.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_scales.data(), d.scales, got_scales.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);

  int64_t code_mismatches = 0, scale_mismatches = 0;
  for (size_t i = 0; i < want_q.size(); ++i) {
    if (got_q[i] == want_q[i]) continue;
    if (code_mismatches++ < 5)
      ADD_FAILURE() << "row " << i / c.k << " column " << i % c.k << ": code " << int{got_q[i]} << ", want "
                    << int{want_q[i]};
  }
  for (size_t i = 0; i < want_scales.size(); ++i) {
    if (got_scales[i] == want_scales[i]) continue;
    if (scale_mismatches++ < 5)
      ADD_FAILURE() << "tile " << i / c.rows_padded << " row " << i % c.rows_padded << ": scale " << got_scales[i]
                    << ", want " << want_scales[i];
  }
  EXPECT_EQ(code_mismatches, 0);
  EXPECT_EQ(scale_mismatches, 0);
}

// One row; a part-filled block of rows with padding; several blocks of rows and tiles, with
// padding past the last full block.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaFp8QuantizeTest,
                         ::testing::Values(QuantiseCase{1, 4, 128}, QuantiseCase{37, 40, 384},
                                           QuantiseCase{130, 132, 1408}, QuantiseCase{256, 256, 2048}));

}  // namespace
}  // namespace dsinfer
