// The CUDA backend over the long teacher-forced references (tests/data/*/reference_long.json,
// tools/make_long_reference.py: 3,072 greedy steps per fixture by HF transformers in fp32), a
// step being 0.03% of agreement: the default path against HF's own 16-bit arithmetic over the
// same steps, and the fp32 precision mode against the CPU backend's bar.
#include <gtest/gtest.h>
#include "teacher_forcing.h"

#include <iostream>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "cuda_test_util.h"
#include "model/deepseek_model.h"

namespace dsinfer {
namespace {

class CudaLongReferenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
    dir_ = testing::fixture_dir(GetParam());
    if (!testing::reference_exists(dir_, testing::kLongReference))
      GTEST_SKIP() << dir_ << "/" << testing::kLongReference << " is absent (tools/make_long_reference.py)";
  }

  testing::TeacherForcedAgreement agreement_with(Precision precision, double clear_margin) const {
    auto backend = make_backend("cuda", precision);
    auto model = load_deepseek_model(dir_, *backend, 0, false);
    return testing::teacher_forced_agreement(*model, dir_, clear_margin, KvCacheFormat::kF32,
                                             testing::kLongReference);
  }

  std::string dir_;
};

// The default path (bf16 activations, fp32 rows in one-row steps; DeepSeek's FP8 activations in
// tiny_v3_fp8's larger products, in three e4m3 terms in its prompts' steps of 33 to 256 rows). HF
// transformers in bf16 agrees on 96.19% / 97.59% / 95.31% of these steps (tiny_v3, tiny_v2_lite,
// tiny_v3_fp8; bench/RESULTS.md, "A long teacher-forced reference"). The bar on the bf16
// checkpoints is 99%; on the FP8 one 98%; over the steps whose reference margin passes 0.2, the
// short fixtures' bars (cuda_model_test.cpp). Measured: 99.15% / 99.41% / 98.27% (95.61% on the
// FP8 one with one term and bf16 rows in its one-row e4m3 walks; RESULTS.md, "FP8 activations in
// terms").
TEST_P(CudaLongReferenceTest, DefaultPathAgreesWithTheReference) {
  const bool fp8_recipe = GetParam() == "tiny_v3_fp8";
  const testing::TeacherForcedAgreement a = agreement_with(Precision::kDefault, 0.2);
  std::cout << GetParam() << " (default path): " << a.describe() << "\n";
  EXPECT_EQ(a.num_steps, 128 * 24);
  EXPECT_GE(a.agreement(), fp8_recipe ? 0.98 : 0.99) << GetParam();
  EXPECT_GE(a.num_clear_agree, (fp8_recipe ? 0.95 : 0.98) * a.num_clear) << GetParam();
}

// The CPU backend with the default path's roundings (CpuRoundings::cuda_default: bf16 product
// inputs but fp32 ones in one-row steps, f16 pairs over e4m3 weights, DeepSeek's FP8 activations
// where the CUDA backend takes them, the attention kernels' bf16 and TF32 operands) predicts the
// default path's agreement to within half a point on the bf16 checkpoints: 99.25 / 99.90%
// against 99.15 / 99.41% (RESULTS.md, "One-row steps on fp32 rows"). What it leaves out (the
// order of sums, the splits of long contexts, where a pending norm's 1 / rms is applied) moves
// only near ties; tiny_v2_lite's 15 steps are the most (reference margins up to 0.09), and none
// of fourteen switches of the CUDA path's forms moved them. On tiny_v3_fp8 it predicts 99.06%
// where the CUDA path gives 98.27%: a point at most. That gap is not in the forms of the FP8
// products: with bf16 rows for every product of up to 256 rows the CUDA path gives 98.37%, and
// ten switches of its forms moved it by 0.4 point at most (RESULTS.md, "FP8 activations in
// terms").
TEST_P(CudaLongReferenceTest, DefaultPathAsTheCpuPredicts) {
  const testing::TeacherForcedAgreement cuda = agreement_with(Precision::kDefault, 1e-3);
  CpuBackend cpu_backend(CpuRoundings::cuda_default());
  auto cpu_model = load_deepseek_model(dir_, cpu_backend, 0, false);
  const testing::TeacherForcedAgreement cpu =
      testing::teacher_forced_agreement(*cpu_model, dir_, 1e-3, KvCacheFormat::kF32, testing::kLongReference);
  std::cout << GetParam() << ": default path " << cuda.describe() << "; the CPU's prediction " << cpu.describe()
            << "\n";
  EXPECT_NEAR(cuda.agreement(), cpu.agreement(), GetParam() == "tiny_v3_fp8" ? 0.01 : 0.005) << GetParam();
}

// The fp32 precision mode holds the CPU backend's bar (long_reference_golden_test.cpp): every
// step whose reference top-2 margin passes 1e-3 picks the reference's token.
TEST_P(CudaLongReferenceTest, Fp32PrecisionModeFollowsTheReference) {
  const testing::TeacherForcedAgreement a = agreement_with(Precision::kFp32, 1e-3);
  std::cout << GetParam() << " (fp32 mode): " << a.describe() << "\n";
  EXPECT_EQ(a.num_steps, 128 * 24);
  EXPECT_GT(a.num_clear, 3000);
  EXPECT_EQ(a.num_clear_agree, a.num_clear) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaLongReferenceTest,
                         ::testing::Values("tiny_v3", "tiny_v2_lite", "tiny_v3_fp8"));

}  // namespace
}  // namespace dsinfer
