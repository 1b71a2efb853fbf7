// Dense weights whose values bf16 would round (a float16 checkpoint's) are packed in two bf16
// terms, the value rounded to bf16 and what that rounding left (weight_terms): their products
// read each row twice and sum the checkpoint's values exactly. Checked against the CPU backend's
// fp32 products and against the same weights packed in one term (DSINFER_CUDA_WEIGHT_TERMS=1).
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "model/deepseek_model.h"
#include "forward_batch_util.h"

namespace dsinfer {
namespace {

using testing_cuda::bf16_values;
using testing_cuda::CudaVsCpuTest;
using testing_cuda::download;
using testing_cuda::make_backend_with_env;
using testing_cuda::random_values;
using testing_cuda::relative_error;
using testing_cuda::upload;

// Values as a float16 checkpoint holds them: 11 significant bits, 3 more than bf16 keeps.
std::vector<float> f16_values(size_t n, uint32_t seed, float stddev) {
  std::vector<float> v = random_values(n, seed, stddev);
  for (float& x : v) x = round_to_f16(x);
  return v;
}

int64_t round_up_128(int64_t v) { return (v + 127) / 128 * 128; }

// Root mean square of got - want.
double rms_difference(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double sum = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) sum += std::pow(double{got[i]} - want[i], 2);
  return std::sqrt(sum / static_cast<double>(std::max<size_t>(1, want.size())));
}

class CudaTwoTermWeightsTest : public CudaVsCpuTest {
 protected:
  void SetUp() override {
    CudaVsCpuTest::SetUp();
    if (IsSkipped()) return;
    one_term_ = make_backend_with_env("cuda", "DSINFER_CUDA_WEIGHT_TERMS", "1");
  }
  std::unique_ptr<Backend> one_term_;
};

// Two terms where bf16 would round a value of a dense weight; one where it holds them all, for a
// routed expert's weight (its grouped products read each row once), e4m3 weights, and under
// DSINFER_CUDA_WEIGHT_TERMS=1. The packed rows are twice as wide, the weight's in_features as given.
TEST_F(CudaTwoTermWeightsTest, PackedInTwoTermsWhereBf16WouldRoundADenseWeight) {
  constexpr int64_t kRows = 48, kCols = 200;
  const std::vector<float> f16 = f16_values(kRows * kCols, 1, 0.1f);
  const std::vector<float> bf16 = bf16_values(f16);
  const HostTensor dense{DType::kF32, {kRows, kCols}, f16.data()};
  HostTensor expert = dense;
  expert.routed_expert = true;
  auto width = [](const LinearWeight& w) { return w.weight.dim(1); };

  const LinearWeight two = gpu_->make_linear(dense);
  EXPECT_EQ(two.in_features, kCols);
  EXPECT_EQ(two.out_features, kRows);
  EXPECT_EQ(width(two), 2 * round_up_128(kCols));
  EXPECT_EQ(width(gpu_->make_gate_up(dense)), 2 * round_up_128(kCols));
  EXPECT_EQ(width(gpu_->make_linear(HostTensor{DType::kF32, {kRows, kCols}, bf16.data()})), round_up_128(kCols));
  EXPECT_EQ(width(gpu_->make_linear(expert)), round_up_128(kCols));
  EXPECT_EQ(width(gpu_->make_gate_up(expert)), round_up_128(kCols));
  EXPECT_EQ(width(one_term_->make_linear(dense)), round_up_128(kCols));
  std::vector<uint8_t> codes(kRows * kCols, 0x38);  // e4m3 1.0 under scales bf16 cannot hold
  std::vector<float> scales(((kRows + 127) / 128) * ((kCols + 127) / 128), 1.0f + 1.0f / 1024.0f);
  const HostTensor e4m3{DType::kF8E4M3, {kRows, kCols}, codes.data(), scales.data(), 128, 128};
  EXPECT_EQ(width(gpu_->make_linear(e4m3)), round_up_128(kCols));
}

// linear and linear_pair at row counts that take the few-row kernel on fp32 rows (1) and on bf16
// rows (3), its 32-row blocks (40) and cuBLASLt (300), over a float16 checkpoint's values with
// inputs bf16 holds: the products are the CPU's fp32 products to their summation order, where
// the weights rounded to one bf16 term are off by some 2^-9 of each value.
TEST_F(CudaTwoTermWeightsTest, ProductsSumTheCheckpointsValues) {
  constexpr int64_t kK = 200, kN1 = 96, kN2 = 48;
  const std::vector<float> w1 = f16_values(kN1 * kK, 2, 1.0f / std::sqrt(float{kK}));
  const std::vector<float> w2 = f16_values(kN2 * kK, 3, 1.0f / std::sqrt(float{kK}));
  const HostTensor h1{DType::kF32, {kN1, kK}, w1.data()}, h2{DType::kF32, {kN2, kK}, w2.data()};
  const LinearWeight cpu1 = cpu_->make_linear(h1), cpu2 = cpu_->make_linear(h2);
  const LinearWeight gpu1 = gpu_->make_linear(h1), gpu2 = gpu_->make_linear(h2);
  const LinearWeight one1 = one_term_->make_linear(h1), one2 = one_term_->make_linear(h2);
  for (const int64_t m : {1, 3, 40, 300}) {
    SCOPED_TRACE("rows " + std::to_string(m));
    const std::vector<float> x = bf16_values(random_values(m * kK, 10 + static_cast<uint32_t>(m)));
    auto run = [&](Backend& be, const LinearWeight& a, const LinearWeight& b, bool pair) {
      Tensor tx = upload(be, {m, kK}, x);
      Tensor y1 = be.empty({m, kN1}, DType::kF32), y2 = be.empty({m, kN2}, DType::kF32);
      if (pair) {
        be.linear_pair(tx, a, y1, b, y2);
      } else {
        be.linear(tx, a, y1);
        be.linear(tx, b, y2);
      }
      std::vector<float> both = download(be, y1);
      const std::vector<float> second = download(be, y2);
      both.insert(both.end(), second.begin(), second.end());
      return both;
    };
    const std::vector<float> want = run(*cpu_, cpu1, cpu2, false);
    for (const bool pair : {false, true}) {
      SCOPED_TRACE(pair ? "linear_pair" : "linear");
      const double two_terms = relative_error(run(*gpu_, gpu1, gpu2, pair), want);
      const double one_term = relative_error(run(*one_term_, one1, one2, pair), want);
      EXPECT_LT(two_terms, 2e-5);
      EXPECT_GT(one_term, 2e-4);
    }
  }
}

// gated_mlp over a float16 checkpoint's gate/up and down: gate and up exactly, then the roundings
// of its intermediate rows that bf16 weights take too (SiLU·up's rows in bf16 but in one-row
// steps, cuBLASLt's gate/up rows in bf16), so the distance to the CPU's fp32 MLP shrinks by what
// the weights' rounding added, and more than bf16 roundings of the intermediate rows explain in
// one-row steps, which keep them in fp32.
TEST_F(CudaTwoTermWeightsTest, GatedMlpReadsBothTerms) {
  constexpr int64_t kHidden = 256, kInter = 144;
  const std::vector<float> gu = f16_values(2 * kInter * kHidden, 4, 1.0f / std::sqrt(float{kHidden}));
  const std::vector<float> down = f16_values(kHidden * kInter, 5, 1.0f / std::sqrt(float{kInter}));
  const HostTensor h_gu{DType::kF32, {2 * kInter, kHidden}, gu.data()};
  const HostTensor h_down{DType::kF32, {kHidden, kInter}, down.data()};
  const LinearWeight cpu_gu = cpu_->make_gate_up(h_gu), cpu_down = cpu_->make_linear(h_down);
  const LinearWeight gpu_gu = gpu_->make_gate_up(h_gu), gpu_down = gpu_->make_linear(h_down);
  const LinearWeight one_gu = one_term_->make_gate_up(h_gu), one_down = one_term_->make_linear(h_down);
  for (const int64_t m : {1, 3, 40, 300}) {
    SCOPED_TRACE("rows " + std::to_string(m));
    const std::vector<float> x = bf16_values(random_values(m * kHidden, 20 + static_cast<uint32_t>(m)));
    auto run = [&](Backend& be, const LinearWeight& w_gu, const LinearWeight& w_down) {
      Tensor tx = upload(be, {m, kHidden}, x), y = be.empty({m, kHidden}, DType::kF32);
      be.gated_mlp(tx, w_gu, w_down, y);
      return download(be, y);
    };
    const std::vector<float> want = run(*cpu_, cpu_gu, cpu_down);
    const std::vector<float> two_terms = run(*gpu_, gpu_gu, gpu_down), one_term = run(*one_term_, one_gu, one_down);
    EXPECT_LT(relative_error(two_terms, want), 1e-2);
    const double two_rms = rms_difference(two_terms, want), one_rms = rms_difference(one_term, want);
    std::cout << "rows " << m << ": rms distance to fp32, two terms " << two_rms << ", one term " << one_rms << "\n";
    EXPECT_LT(two_rms, (m == 1 ? 0.1 : 0.85) * one_rms);
  }
}

// A float16 checkpoint (tiny_v2_lite) runs its dense weights in two terms through a model's
// paths (norms left to products, shared experts after routed ones in two terms, the LM head), in
// a prompt step and one-row decode steps over a fixed sequence: its logits come closer to the fp32
// precision mode's than with the weights rounded to one term.
TEST(CudaTwoTermModelTest, AFloat16CheckpointsLogitsComeCloserToFp32) {
  if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
  const std::string dir = testing_cuda::source_dir() + "/tests/data/tiny_v2_lite";
  constexpr int kBlockSize = 64, kNumBlocks = 2, kPromptLength = 40, kDecodeSteps = 12;
  std::vector<TokenId> seq;
  for (int i = 0; i < kPromptLength + kDecodeSteps; ++i) seq.push_back(static_cast<TokenId>((i * 37 + 5) % 384));
  auto logits_of = [&](std::unique_ptr<Backend> backend) {
    auto model = load_deepseek_model(dir, *backend, 0, false);
    KvCaches caches = model->allocate_caches(kNumBlocks, kBlockSize, KvCacheFormat::kF32);
    std::vector<TokenId> prompt(seq.begin(), seq.begin() + kPromptLength);
    std::vector<float> all = download(
        *backend, model->forward(testing::single_sequence_batch(prompt, 0, kNumBlocks, kBlockSize), caches).logits);
    for (int step = 0; step < kDecodeSteps; ++step) {
      std::vector<TokenId> upto(seq.begin(), seq.begin() + kPromptLength + step + 1);
      const int position = kPromptLength + step;
      const std::vector<float> row = download(
          *backend,
          model->forward(testing::single_sequence_batch(upto, position, kNumBlocks, kBlockSize), caches).logits);
      all.insert(all.end(), row.begin(), row.end());
    }
    return all;
  };
  const std::vector<float> fp32 = logits_of(make_backend("cuda", Precision::kFp32));
  const std::vector<float> two_terms = logits_of(make_backend("cuda"));
  const std::vector<float> one_term = logits_of(make_backend_with_env("cuda", "DSINFER_CUDA_WEIGHT_TERMS", "1"));
  const double two_rms = rms_difference(two_terms, fp32), one_rms = rms_difference(one_term, fp32);
  std::cout << "tiny_v2_lite logits' rms distance to the fp32 mode's: two terms " << two_rms << ", one term "
            << one_rms << "\n";
  EXPECT_LT(two_rms, 0.8 * one_rms);
  EXPECT_LT(relative_error(two_terms, fp32), 3e-2);
}

}  // namespace
}  // namespace dsinfer
