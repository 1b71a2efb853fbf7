// The CUDA backend's fp32 precision mode (DSINFER_CUDA_PRECISION=fp32) against the CPU backend:
// products that round nothing below fp32, so they follow the CPU's fp32 products to the order
// of their sums (about 1e-6 of the result's scale; the default's bf16 activations leave about
// 1e-3), and rows whose bits do not depend on the batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "cuda_test_util.h"

namespace dsinfer {
namespace {

using testing_cuda::download;
using testing_cuda::make_backend_with_env;
using testing_cuda::random_values;
using testing_cuda::relative_error;
using testing_cuda::upload;

// fp32 sums of up to a few thousand terms in another order than the CPU's.
constexpr double kFp32Tolerance = 1e-5;

class CudaF32PrecisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
    cpu_ = make_backend("cpu");
    gpu_ = make_backend_with_env("cuda", "DSINFER_CUDA_PRECISION", "fp32");
  }
  std::unique_ptr<Backend> cpu_, gpu_;
};

std::vector<float> linear_on(Backend& be, const HostTensor& w, const std::vector<float>& x, int64_t m) {
  const LinearWeight lw = be.make_linear(w);
  Tensor tx = upload(be, {m, w.shape[1]}, x), ty = be.empty({m, w.shape[0]}, DType::kF32);
  be.linear(tx, lw, ty);
  return download(be, ty);
}

TEST_F(CudaF32PrecisionTest, LinearMatchesCpuAtShapesThatAreNotWholeTiles) {
  // Rows over one and several 64-row blocks, outputs and inputs that are not whole 64-output
  // tiles or 16-column slabs; chunks of k in blocks of their own (few tiles) and one after
  // another in each block (1,100 x 1,000: 288 tiles).
  struct Shape { int64_t m, n, k; };
  for (Shape s : {Shape{1, 64, 64}, Shape{7, 200, 97}, Shape{65, 576, 2048}, Shape{130, 1000, 384},
                  Shape{5, 3, 24}, Shape{1100, 1000, 300}}) {
    const auto w = random_values(s.n * s.k, 11, 1.0f / std::sqrt(static_cast<float>(s.k)));
    const auto x = random_values(s.m * s.k, 12);
    const HostTensor h{DType::kF32, {s.n, s.k}, w.data()};
    EXPECT_LT(relative_error(linear_on(*gpu_, h, x, s.m), linear_on(*cpu_, h, x, s.m)), kFp32Tolerance)
        << s.m << "x" << s.n << "x" << s.k;
  }
}

TEST_F(CudaF32PrecisionTest, F16AndFp8WeightsKeepTheirValues) {
  // f16 weights are not rounded to bf16, and e4m3 ones enter at code × block scale.
  const int64_t m = 33, n = 256, k = 384;
  const auto values = random_values(n * k, 21, 0.05f);
  std::vector<uint16_t> f16(n * k);
  for (int64_t i = 0; i < n * k; ++i) f16[i] = f32_to_f16(values[i]);
  std::vector<float> scales(2 * 3);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 1e-3f * (1.0f + static_cast<float>(i));
  std::vector<uint8_t> fp8(n * k);
  for (int64_t i = 0; i < n * k; ++i) fp8[i] = f32_to_fp8e4m3(values[i] * 1e3f);
  const auto x = random_values(m * k, 22);
  for (const HostTensor& h : {HostTensor{DType::kF16, {n, k}, f16.data()},
                              HostTensor{DType::kF8E4M3, {n, k}, fp8.data(), scales.data(), 128, 128}}) {
    EXPECT_LT(relative_error(linear_on(*gpu_, h, x, m), linear_on(*cpu_, h, x, m)), kFp32Tolerance)
        << dtype_name(h.dtype);
  }
}

TEST_F(CudaF32PrecisionTest, GatedMlpAndLinearPairMatchCpu) {
  const int64_t m = 70, hidden = 80, inter = 24;
  const auto gu = random_values(2 * inter * hidden, 31, 1.0f / std::sqrt(static_cast<float>(hidden)));
  const auto down = random_values(hidden * inter, 32, 1.0f / std::sqrt(static_cast<float>(inter)));
  const auto x = random_values(m * hidden, 33);
  std::vector<float> mlp[2], pair[2][2];
  Backend* bes[2] = {cpu_.get(), gpu_.get()};
  for (int i = 0; i < 2; ++i) {
    Backend& be = *bes[i];
    const LinearWeight w_gu = be.make_gate_up(HostTensor{DType::kF32, {2 * inter, hidden}, gu.data()});
    const LinearWeight w_down = be.make_linear(HostTensor{DType::kF32, {hidden, inter}, down.data()});
    Tensor tx = upload(be, {m, hidden}, x), ty = be.empty({m, hidden}, DType::kF32);
    be.gated_mlp(tx, w_gu, w_down, ty);
    mlp[i] = download(be, ty);
    // The pair: gate/up's rows as a plain weight, and down's transpose-shaped sibling.
    const LinearWeight w1 = be.make_linear(HostTensor{DType::kF32, {2 * inter, hidden}, gu.data()});
    const LinearWeight w2 = be.make_linear(HostTensor{DType::kF32, {inter, hidden}, gu.data()});
    Tensor y1 = be.empty({m, 2 * inter}, DType::kF32), y2 = be.empty({m, inter}, DType::kF32);
    be.linear_pair(tx, w1, y1, w2, y2);
    pair[i][0] = download(be, y1);
    pair[i][1] = download(be, y2);
  }
  EXPECT_LT(relative_error(mlp[1], mlp[0]), kFp32Tolerance);
  EXPECT_LT(relative_error(pair[1][0], pair[0][0]), kFp32Tolerance);
  EXPECT_LT(relative_error(pair[1][1], pair[0][1]), kFp32Tolerance);
}

// A row alone runs k's chunks in blocks of their own (9 tiles), 2,000 rows (288 tiles) run
// them one after another in each block: the same additions, the same bits.
TEST_F(CudaF32PrecisionTest, RowsGiveTheSameBitsAloneAndInAnyBatch) {
  const int64_t n = 576, k = 2048;
  const auto w = random_values(n * k, 41, 1.0f / std::sqrt(static_cast<float>(k)));
  const auto x = random_values(2000 * k, 42);
  const HostTensor h{DType::kF32, {n, k}, w.data()};
  const auto alone = linear_on(*gpu_, h, {x.begin(), x.begin() + k}, 1);
  for (int64_t rows : {2, 7, 64, 65, 300, 2000}) {
    const auto many = linear_on(*gpu_, h, {x.begin(), x.begin() + rows * k}, rows);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), many.begin())) << rows << " rows";
  }
}

}  // namespace
}  // namespace dsinfer
