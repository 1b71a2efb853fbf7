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
// tiny_v3_fp8's larger products and experts, in three e4m3 terms in its prompts' steps of up to
// 256 rows). HF transformers in bf16 agrees on 96.19% / 97.59% / 95.31%
// of these steps (tiny_v3, tiny_v2_lite, tiny_v3_fp8; bench/RESULTS.md, "A long teacher-forced
// reference"). The bar is 99%; over the steps whose reference margin passes 0.2, the short
// fixtures' bars (cuda_model_test.cpp). Measured: 99.15% / 99.84% / 99.25% (98.27% on the FP8 one
// while its gate/up weights were widened to bf16 and its experts took the single term there;
// RESULTS.md, "Exact FP8 gate/up weights"; 99.41% on tiny_v2_lite while its float16 dense weights
// were rounded to one bf16 term, "A float16 checkpoint's dense weights in two bf16 terms").
TEST_P(CudaLongReferenceTest, DefaultPathAgreesWithTheReference) {
  const testing::TeacherForcedAgreement a = agreement_with(Precision::kDefault, 0.2);
  std::cout << GetParam() << " (default path): " << a.describe() << "\n";
  EXPECT_EQ(a.num_steps, 128 * 24);
  EXPECT_GE(a.agreement(), 0.99) << GetParam();
  EXPECT_GE(a.num_clear_agree, 0.98 * a.num_clear) << GetParam();
}

// The CPU backend with the default path's roundings (CpuRoundings::cuda_default: bf16 product
// inputs but fp32 ones in one-row steps, f16 pairs over e4m3 weights, DeepSeek's FP8 activations
// where the CUDA backend takes them, the attention kernels' bf16 and TF32 operands) predicts the
// default path's agreement to within half a point: 99.25 / 99.90 / 99.35% against 99.15 / 99.84 /
// 99.25% (RESULTS.md, "A float16 checkpoint's dense weights in two bf16 terms"). What it leaves out
// (the order of sums, the splits of long contexts, where a pending norm's 1 / rms is applied) moves
// only near ties. tiny_v2_lite's float16 weights are kept as the CUDA backend keeps them: its dense
// ones exact (two bf16 terms), its routed experts' rounded to bf16.
TEST_P(CudaLongReferenceTest, DefaultPathAsTheCpuPredicts) {
  const testing::TeacherForcedAgreement cuda = agreement_with(Precision::kDefault, 1e-3);
  CpuBackend cpu_backend(CpuRoundings::cuda_default());
  auto cpu_model = load_deepseek_model(dir_, cpu_backend, 0, false);
  const testing::TeacherForcedAgreement cpu =
      testing::teacher_forced_agreement(*cpu_model, dir_, 1e-3, KvCacheFormat::kF32, testing::kLongReference);
  std::cout << GetParam() << ": default path " << cuda.describe() << "; the CPU's prediction " << cpu.describe()
            << "\n";
  EXPECT_NEAR(cuda.agreement(), cpu.agreement(), 0.005) << GetParam();
}

// Where the agreement counts move only with near ties, the logits' distance from the fp32 CPU
// backend's along the reference path measures the whole error: the median over the prompts'
// steps and over the others, the default path's against the CPU's prediction. Measured (H100,
// RESULTS.md, "Exact FP8 gate/up weights" and "A float16 checkpoint's dense weights in two bf16
// terms"): within 10% of the prediction on every fixture, where the two roundings the prediction
// lacked had put the default path's decode steps at 3.4 times it (tiny_v2_lite, its float16
// weights kept in bf16) and 1.3 times (tiny_v3_fp8, its gate/up pairs widened to bf16).
TEST_P(CudaLongReferenceTest, DefaultPathErrorAsTheCpuPredicts) {
  CpuBackend fp32_backend{CpuRoundings{}}, predicting_backend(CpuRoundings::cuda_default());
  auto fp32_model = load_deepseek_model(dir_, fp32_backend, 0, false);
  auto predicting_model = load_deepseek_model(dir_, predicting_backend, 0, false);
  auto cuda_backend = make_backend("cuda", Precision::kDefault);
  auto cuda_model = load_deepseek_model(dir_, *cuda_backend, 0, false);
  const testing::TeacherForcedLogits reference = testing::teacher_forced_logits(*fp32_model, dir_);
  const testing::TeacherForcedLogits predicted = testing::teacher_forced_logits(*predicting_model, dir_);
  const testing::TeacherForcedLogits cuda = testing::teacher_forced_logits(*cuda_model, dir_);
  for (const bool prefill : {true, false}) {
    const double want = testing::median_rms_distance(predicted, reference, prefill);
    const double got = testing::median_rms_distance(cuda, reference, prefill);
    std::cout << GetParam() << (prefill ? " prompt" : " decode") << " steps: median RMS logit distance from fp32 "
              << got << ", the CPU's prediction " << want << "\n";
    EXPECT_GT(want, 1e-4) << GetParam();  // the prediction rounds
    EXPECT_LT(got, 1.2 * want) << GetParam() << (prefill ? " prompt steps" : " decode steps");
    EXPECT_GT(got, 0.8 * want) << GetParam() << (prefill ? " prompt steps" : " decode steps");
  }
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
