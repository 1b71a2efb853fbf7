// The pass that quantises bf16 activation rows (or fp32 ones, rounded to bf16 on the way) to
// DeepSeek's FP8 format: every code and every scale against the host's quantiser, bit for bit,
// at row counts that leave part-filled blocks, with padding rows (zeros, scale 1), an all-zero
// tile and tiles of very different magnitudes. And SiLU·up written straight in that format: the
// same bits as SiLU·up's bf16 rows through the pass.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

// Cases of a kernel, skipped where no CUDA device is visible.
template <typename Case>
class CudaKernelCaseTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

class CudaFp8QuantizeTest : public CudaKernelCaseTest<QuantiseCase> {};

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
  // tile get scales far apart. Row 1's second tile is all zeros (scale 1, zero codes). Row 2's
  // values are scaled by a further 2^-120, so that its scales fall below the bound from which the
  // kernels divide by the tile's reciprocal (2^-90, with_e4m3_quotient) and they divide instead.
  const auto values = random_values(c.rows * c.k, 91);
  std::vector<uint16_t> x(c.rows * c.k);
  std::vector<float> x_f32(c.rows * c.k);  // the values before their rounding to bf16
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t col = 0; col < c.k; ++col) {
      const int exponent = static_cast<int>(r % 7) - 3 + 2 * (col / 128 % 3) - (r == 2 ? 120 : 0);
      const float v = values[r * c.k + col] * std::ldexp(1.0f, exponent);
      x_f32[r * c.k + col] = r == 1 && col / 128 == 1 ? 0.0f : v;
      x[r * c.k + col] = f32_to_bf16(x_f32[r * c.k + col]);
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

  // From the bf16 rows, and from the fp32 values that round to them (the pass rounds them itself).
  for (const bool from_f32 : {false, true}) {
    SCOPED_TRACE(from_f32 ? "fp32 rows" : "bf16 rows");
    const size_t x_bytes = from_f32 ? x_f32.size() * sizeof(float) : x.size() * sizeof(uint16_t);
    DeviceBuffers d;
    ASSERT_EQ(cudaMalloc(&d.x, x_bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d.q, want_q.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d.scales, want_scales.size() * sizeof(float)), cudaSuccess);
    const void* host_x = from_f32 ? static_cast<const void*>(x_f32.data()) : x.data();
    ASSERT_EQ(cudaMemcpy(d.x, host_x, x_bytes, cudaMemcpyHostToDevice), cudaSuccess);
    // Garbage where the pass must write: padding rows included.
    ASSERT_EQ(cudaMemset(d.q, 0x7e, want_q.size()), cudaSuccess);
    ASSERT_EQ(cudaMemset(d.scales, 0x7f, want_scales.size() * sizeof(float)), cudaSuccess);
    if (from_f32)
      cuda::launch_quantize_rows_f32_e4m3(static_cast<float*>(d.x), c.rows, c.k, c.rows_padded,
                                          static_cast<uint8_t*>(d.q), static_cast<float*>(d.scales), nullptr);
    else
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
}

// One row; a part-filled block of rows with padding; several blocks of rows and tiles, with
// padding past the last full block.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaFp8QuantizeTest,
                         ::testing::Values(QuantiseCase{1, 4, 128}, QuantiseCase{37, 40, 384},
                                           QuantiseCase{130, 132, 1408}, QuantiseCase{256, 256, 2048}));

struct SiluCase {
  int64_t rows, rows_padded, inter;
  bool gate_up_bf16;
  bool halves = false;  // every gate column, then every up column, instead of interleaved by 16
};

class CudaSiluE4m3Test : public CudaKernelCaseTest<SiluCase> {};

// Device buffers of the two forms, freed on every path out of the test.
struct SiluBuffers {
  void* gate_up = nullptr;
  void* act = nullptr;
  void* q[2] = {nullptr, nullptr};
  void* scales[2] = {nullptr, nullptr};
  ~SiluBuffers() {
    for (void* p : {gate_up, act, q[0], q[1], scales[0], scales[1]}) cudaFree(p);
  }
};

TEST_P(CudaSiluE4m3Test, OnePassGivesTheBitsOfBf16RowsThroughTheQuantisingPass) {
  const SiluCase c = GetParam();
  const int64_t tiles = c.inter / 128, width = 2 * c.inter;
  // gate/up rows as the packed weight gives them: 16 gate columns, then their 16 up columns (or
  // the halves' copy: the gate columns, then the up columns). Row r scaled by 2^(r % 5 - 2), so
  // rows get scales far apart.
  const auto values = random_values(c.rows * width, 93, 4.0f);
  std::vector<float> gate_up(c.rows * width);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t col = 0; col < width; ++col)
      gate_up[r * width + col] = values[r * width + col] * std::ldexp(1.0f, static_cast<int>(r % 5) - 2);
  std::vector<uint16_t> gate_up_bf16(gate_up.size());
  for (size_t i = 0; i < gate_up.size(); ++i) {
    gate_up_bf16[i] = f32_to_bf16(gate_up[i]);
    if (c.gate_up_bf16) gate_up[i] = bf16_to_f32(gate_up_bf16[i]);
  }

  const size_t q_bytes = c.rows_padded * c.inter, scale_bytes = tiles * c.rows_padded * sizeof(float);
  SiluBuffers d;
  const size_t in_bytes = gate_up.size() * (c.gate_up_bf16 ? sizeof(uint16_t) : sizeof(float));
  ASSERT_EQ(cudaMalloc(&d.gate_up, in_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d.act, c.rows * c.inter * sizeof(uint16_t)), cudaSuccess);
  for (int form = 0; form < 2; ++form) {
    ASSERT_EQ(cudaMalloc(&d.q[form], q_bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d.scales[form], scale_bytes), cudaSuccess);
    // Different garbage in each form's buffers: a value neither form writes cannot match.
    ASSERT_EQ(cudaMemset(d.q[form], form == 0 ? 0x7e : 0x3c, q_bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(d.scales[form], form == 0 ? 0x7f : 0x5a, scale_bytes), cudaSuccess);
  }
  const void* host_in = c.gate_up_bf16 ? static_cast<const void*>(gate_up_bf16.data()) : gate_up.data();
  ASSERT_EQ(cudaMemcpy(d.gate_up, host_in, in_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  cuda::launch_silu_mul_interleaved(d.gate_up, c.gate_up_bf16, c.rows, c.inter, c.halves,
                                    static_cast<uint16_t*>(d.act), nullptr);
  cuda::launch_quantize_rows_e4m3(static_cast<uint16_t*>(d.act), c.rows, c.inter, c.rows_padded,
                                  static_cast<uint8_t*>(d.q[0]), static_cast<float*>(d.scales[0]), nullptr);
  cuda::launch_silu_mul_interleaved_e4m3(d.gate_up, c.gate_up_bf16, c.rows, c.inter, c.halves, c.rows_padded,
                                         static_cast<uint8_t*>(d.q[1]), static_cast<float*>(d.scales[1]), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> q[2];
  std::vector<float> scales[2];
  for (int form = 0; form < 2; ++form) {
    q[form].resize(q_bytes);
    scales[form].resize(tiles * c.rows_padded);
    ASSERT_EQ(cudaMemcpy(q[form].data(), d.q[form], q_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(scales[form].data(), d.scales[form], scale_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  EXPECT_EQ(std::memcmp(scales[0].data(), scales[1].data(), scale_bytes), 0);
  int64_t mismatches = 0;
  for (size_t i = 0; i < q_bytes; ++i)
    if (q[0][i] != q[1][i] && mismatches++ < 5)
      ADD_FAILURE() << "row " << i / c.inter << " column " << i % c.inter << ": code " << int{q[1][i]} << ", want "
                    << int{q[0][i]};
  EXPECT_EQ(mismatches, 0);

  // And against the host's SiLU·up of the interleaved columns: the device's expf may round a
  // bf16 value the other way now and then, so codes are compared by count.
  int64_t host_mismatches = 0;
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t t = 0; t < tiles; ++t) {
      float act[128], amax = 0.0f;
      for (int64_t j = 0; j < 128; ++j) {
        const int64_t out = t * 128 + j, gate_col = c.halves ? out : (out / 16) * 32 + out % 16;
        const float g = gate_up[r * width + gate_col], u = gate_up[r * width + gate_col + (c.halves ? c.inter : 16)];
        act[j] = bf16_to_f32(f32_to_bf16(g / (1.0f + std::exp(-g)) * u));
        amax = std::max(amax, std::abs(act[j]));
      }
      const float scale = e4m3_block_scale(amax);
      for (int64_t j = 0; j < 128; ++j)
        host_mismatches += q[1][r * c.inter + t * 128 + j] != f32_to_fp8e4m3(act[j] / scale);
    }
  EXPECT_LE(host_mismatches, c.rows * c.inter / 200) << "of " << c.rows * c.inter << " codes";
  for (int64_t r = c.rows; r < c.rows_padded; ++r)
    for (int64_t t = 0; t < tiles; ++t) EXPECT_EQ(scales[1][t * c.rows_padded + r], 1.0f) << "padding row " << r;
}

// A part-filled block of rows with padding, from bf16 and fp32 gate/up rows; blocks of rows and
// several tiles.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaSiluE4m3Test,
                         ::testing::Values(SiluCase{1, 4, 128, true}, SiluCase{37, 40, 384, false},
                                           SiluCase{197, 200, 1408, true}, SiluCase{256, 256, 2816, true},
                                           SiluCase{37, 40, 384, false, true}, SiluCase{197, 200, 1408, true, true}));

}  // namespace
}  // namespace dsinfer
