// The CPU backend over the long teacher-forced references (tests/data/*/reference_long.json,
// tools/make_long_reference.py: 128 prompts of 1 to 200 tokens, 24 greedy tokens each, by HF
// transformers in fp32 on the CPU). A step there is 0.03% of agreement against the short
// reference's 0.7%, fine enough to tell 98.6% from 99.3%: whether a rounding of the products'
// inputs reaches the 99% bar, before a backend is built around it.
#include <gtest/gtest.h>
#include "teacher_forcing.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "model/deepseek_model.h"
#include "model/model_config.h"

namespace dsinfer {
namespace {

class LongReferenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = testing::fixture_dir(GetParam());
    if (!testing::reference_exists(dir_, testing::kLongReference))
      GTEST_SKIP() << dir_ << "/" << testing::kLongReference << " is absent (tools/make_long_reference.py)";
  }

  testing::TeacherForcedAgreement agreement_with(CpuBackend::ProductInputs inputs, double clear_margin,
                                                 CpuFp8Activations fp8_activations = {}) const {
    return agreement_with(CpuRoundings{.product_inputs = inputs, .fp8_activations = fp8_activations}, clear_margin);
  }

  testing::TeacherForcedAgreement agreement_with(const CpuRoundings& roundings, double clear_margin) const {
    CpuBackend backend(roundings);
    auto model = load_deepseek_model(dir_, backend, 0, false);
    return testing::teacher_forced_agreement(*model, dir_, clear_margin, KvCacheFormat::kF32,
                                             testing::kLongReference);
  }

  std::string dir_;
};

// fp32 products follow the fp32 reference: every step whose reference top-2 margin passes 1e-3
// picks its token (the short reference's bar, over 20 times the steps), and the prompts'
// lengths reach every product form the engine picks by row count.
TEST_P(LongReferenceTest, Fp32FollowsTheReference) {
  const testing::TeacherForcedAgreement a = agreement_with(CpuBackend::ProductInputs::kFp32, 1e-3);
  std::cout << GetParam() << " (fp32): " << a.describe() << "\n";
  EXPECT_EQ(a.num_steps, 128 * 24);
  EXPECT_GT(a.num_clear, 3000);
  EXPECT_EQ(a.num_clear_agree, a.num_clear) << GetParam();
  EXPECT_EQ(*std::min_element(a.prompt_lengths.begin(), a.prompt_lengths.end()), 1);
  EXPECT_GT(*std::max_element(a.prompt_lengths.begin(), a.prompt_lengths.end()), 128);
  for (const testing::TeacherForcedMiss& miss : a.misses) EXPECT_LT(miss.reference_margin, 1e-3);
}

// Ten mantissa bits in products' inputs (f16 everywhere; f16 pairs in one-row sums, as the
// few-row walks would add them; f16 in steps of two rows or more with one-row steps in fp32)
// against bf16's eight. HF transformers computing wholly in f16 agrees on 99.25-99.90% of these
// steps and wholly in bf16 on 95.3-97.6% (bench/RESULTS.md, "A long teacher-forced reference").
// Here (RESULTS.md, "The long references committed"; tiny_v3 / tiny_v2_lite / tiny_v3_fp8): f16
// 99.67 / 100 / 99.77%, f16 pairs 99.54 / 99.87 / 99.64%, f16 in steps of two rows or more
// 99.87 / 99.97 / 99.90%, bf16 98.08 / 99.41 / 97.95% and bf16 in steps of two rows or more
// 99.32 / 99.84 / 99.22%.
TEST_P(LongReferenceTest, SixteenBitProductInputs) {
  using Inputs = CpuBackend::ProductInputs;
  const testing::TeacherForcedAgreement bf16 = agreement_with(Inputs::kBf16, 1e-3);
  const testing::TeacherForcedAgreement multirow = agreement_with(Inputs::kBf16MultiRow, 1e-3);
  const testing::TeacherForcedAgreement f16 = agreement_with(Inputs::kF16, 1e-3);
  const testing::TeacherForcedAgreement pairs = agreement_with(Inputs::kF16Pairs, 1e-3);
  const testing::TeacherForcedAgreement f16_multirow = agreement_with(Inputs::kF16MultiRow, 1e-3);
  std::cout << GetParam() << " (bf16 inputs): " << bf16.describe() << "\n"
            << GetParam() << " (bf16 in steps of two rows or more): " << multirow.describe() << "\n"
            << GetParam() << " (f16 inputs): " << f16.describe() << "\n"
            << GetParam() << " (f16 inputs, one-row products in f16 pairs): " << pairs.describe() << "\n"
            << GetParam() << " (f16 in steps of two rows or more): " << f16_multirow.describe() << "\n";
  EXPECT_GE(f16.agreement(), 0.99) << GetParam();
  EXPECT_GE(pairs.agreement(), 0.99) << GetParam();
  EXPECT_GE(f16_multirow.agreement(), 0.99) << GetParam();
  EXPECT_GE(bf16.agreement(), 0.97) << GetParam();
  EXPECT_GE(multirow.agreement(), 0.99) << GetParam();
}

// DeepSeek's FP8 activations, one term, where the CUDA backend's forms start to take them (dense
// products of steps above 32 rows, routed experts of steps above two), with bf16 inputs elsewhere
// and with f16 in steps of two rows or more. Only tiny_v3_fp8 has e4m3 weights: 94.95% and 96.03%
// there (its gate/up pairs in e4m3 as stored; 96.06% and 96.88% while they were widened), short
// of 99% either way; with the recipe only in steps of 257 rows or more, f16 reaches 99.90%
// (RESULTS.md, "Exact FP8 gate/up weights"; the bf16 checkpoints: their bf16 and f16 figures).
TEST_P(LongReferenceTest, Fp8ActivationsWhereTheCudaBackendTakesThem) {
  using Inputs = CpuBackend::ProductInputs;
  const CpuFp8Activations cuda_default{33, 3}, from_257_rows{257, 257};
  const testing::TeacherForcedAgreement bf16 = agreement_with(Inputs::kBf16, 1e-3, cuda_default);
  const testing::TeacherForcedAgreement f16 = agreement_with(Inputs::kF16MultiRow, 1e-3, cuda_default);
  const testing::TeacherForcedAgreement f16_later = agreement_with(Inputs::kF16MultiRow, 1e-3, from_257_rows);
  std::cout << GetParam() << " (bf16 inputs, FP8 activations as on CUDA): " << bf16.describe() << "\n"
            << GetParam() << " (f16 in steps of two rows or more, FP8 activations as on CUDA): " << f16.describe()
            << "\n"
            << GetParam() << " (the same, FP8 activations from steps of 257 rows): " << f16_later.describe() << "\n";
  EXPECT_GE(bf16.agreement(), 0.94) << GetParam();
  EXPECT_GE(f16.agreement(), 0.96) << GetParam();
  EXPECT_GE(f16_later.agreement(), 0.99) << GetParam();
}

// The attention kernels' operands as the CUDA backend rounds them (the expanded form's and the
// query tiles' bf16, the head tiles' TF32), alone and with the products' roundings of the default path
// (CpuRoundings::cuda_default): 99.80 / 99.97 / 99.64% alone and 99.25 / 99.90 / 99.35% with the
// products' and the routed experts' bf16 weights (tiny_v3, tiny_v2_lite, tiny_v3_fp8; 99.38% on
// tiny_v2_lite while every float16 linear weight was rounded to bf16; RESULTS.md, "A float16
// checkpoint's dense weights in two bf16 terms"), where the CUDA default path scores 99.15 /
// 99.84 / 99.25%: the products decide its score, not attention. Before one-row steps took fp32
// rows over bf16 weights the products' roundings gave 98.11 / 99.41 / 95.48% ("The long
// references committed").
TEST_P(LongReferenceTest, TheCudaDefaultPathsRoundings) {
  const CpuRoundings attention_only = CpuRoundings::cuda_attention_with(CpuProductInputs::kFp32);
  const testing::TeacherForcedAgreement attention = agreement_with(attention_only, 1e-3);
  const testing::TeacherForcedAgreement cuda_default = agreement_with(CpuRoundings::cuda_default(), 1e-3);
  std::cout << GetParam() << " (the attention kernels' roundings): " << attention.describe() << "\n"
            << GetParam() << " (the CUDA default path's roundings): " << cuda_default.describe() << "\n";
  EXPECT_GE(attention.agreement(), 0.99) << GetParam();
  EXPECT_GE(cuda_default.agreement(), 0.99) << GetParam();
}

// The two routes to 99% the CPU's roundings point to, with attention left as the CUDA kernels
// round it:
// f16 inputs in steps of two rows or more, fp32 in one-row steps, DeepSeek's FP8 activations
// only from 129 rows; and bf16 with fp32 one-row steps, no FP8 activations. 99.84 / 100 / 98.93%
// and 99.25 / 99.90 / 99.35% (RESULTS.md, "Exact FP8 gate/up weights"): the first route leaves
// tiny_v3_fp8 short once its gate/up pairs take the recipe too (99.06% while they were widened).
TEST_P(LongReferenceTest, RoutesToNinetyNinePercent) {
  const testing::TeacherForcedAgreement f16_route =
      agreement_with(CpuRoundings::cuda_attention_with(CpuProductInputs::kF16MultiRow, {129, 129}), 1e-3);
  const testing::TeacherForcedAgreement fp32_decode_rows =
      agreement_with(CpuRoundings::cuda_attention_with(CpuProductInputs::kBf16MultiRow), 1e-3);
  std::cout << GetParam() << " (f16 in steps of two rows or more, FP8 activations from 129 rows, attention as on "
            << "CUDA): " << f16_route.describe() << "\n"
            << GetParam() << " (bf16 in steps of two rows or more, no FP8 activations, attention as on CUDA): "
            << fp32_decode_rows.describe() << "\n";
  EXPECT_GE(f16_route.agreement(), GetParam() == "tiny_v3_fp8" ? 0.985 : 0.99) << GetParam();
  EXPECT_GE(fp32_decode_rows.agreement(), 0.99) << GetParam();
}

// Which of decode's one-row products need fp32 rows for the second route (bf16 in steps of two
// rows or more, attention as on CUDA): DSINFER_CPU_ONE_ROW_BF16 keeps bf16 in some of them, named
// by their input widths on the checkpoint. The shared experts' and the dense layer's down
// products may keep bf16 (99.15 / 99.67 / 98.93% against HF, 0.10-0.26 point under fp32 rows
// everywhere); the products after a norm may not (0.5-0.7 point lost on every fixture), nor may
// the routed experts on the V3 fixtures (0.3-0.4 point, below 99%).
TEST_P(LongReferenceTest, DecodeProductsThatNeedFp32Rows) {
  const ModelConfig config = ModelConfig::load(dir_);
  const CpuRoundings all_fp32 = CpuRoundings::cuda_attention_with(CpuProductInputs::kBf16MultiRow);
  auto keeping = [&](CpuOneRowBf16 kept) {
    CpuRoundings r = all_fp32;
    r.one_row_bf16 = std::move(kept);
    return agreement_with(r, 1e-3);
  };
  const testing::TeacherForcedAgreement none = agreement_with(all_fp32, 1e-3);
  const testing::TeacherForcedAgreement downs = keeping(
      {.input_widths = {config.intermediate_size, int64_t{config.moe_intermediate_size} * config.n_shared_experts}});
  const testing::TeacherForcedAgreement after_norm = keeping({.input_widths = {config.hidden_size}});
  const testing::TeacherForcedAgreement routed = keeping({.routed_experts = true, .input_widths = {}});
  const testing::TeacherForcedAgreement o_proj =
      keeping({.input_widths = {int64_t{config.num_attention_heads} * config.v_head_dim}});
  std::cout << GetParam() << " (every one-row product on fp32 rows): " << none.describe() << "\n"
            << GetParam() << " (the shared and dense down products on bf16): " << downs.describe() << "\n"
            << GetParam() << " (the products after a norm on bf16): " << after_norm.describe() << "\n"
            << GetParam() << " (the routed experts on bf16): " << routed.describe() << "\n"
            << GetParam() << " (o_proj on bf16): " << o_proj.describe() << "\n";
  if (config.q_lora_rank > 0) {
    std::cout << GetParam() << " (q_b_proj on bf16): " << keeping({.input_widths = {config.q_lora_rank}}).describe()
              << "\n";
  }
  EXPECT_GE(downs.agreement(), none.agreement() - 0.003) << GetParam();
  EXPECT_LE(after_norm.agreement(), none.agreement() - 0.003) << GetParam();
  if (GetParam() != "tiny_v2_lite") {
    EXPECT_LT(routed.agreement(), 0.99) << GetParam();
  }
}

// The FP8 checkpoint under variations of the CUDA default path's roundings.
class LongReferenceFp8Test : public LongReferenceTest {};

// The FP8 checkpoint's default path (CpuRoundings::cuda_default) needs both of its changes to
// DeepSeek's recipe: f16 rows in the one-row e4m3 walks (bf16 ones: 98.24%), and FP8
// activations in terms in steps of up to 256 rows (one term: 96.13%; two 99.12%, three 99.35%;
// RESULTS.md, "Exact FP8 gate/up weights").
TEST_P(LongReferenceFp8Test, NeedsF16RowsAndActivationTerms) {
  CpuRoundings bf16_rows = CpuRoundings::cuda_default();
  bf16_rows.one_row_e4m3_f16_pairs = false;
  bf16_rows.one_row_bf16.e4m3_weights = true;
  CpuRoundings one_term = CpuRoundings::cuda_default();
  one_term.fp8_activations.dense_terms = 1;
  CpuRoundings two_terms = CpuRoundings::cuda_default();
  two_terms.fp8_activations.dense_terms = 2;
  const testing::TeacherForcedAgreement a = agreement_with(bf16_rows, 1e-3), b = agreement_with(one_term, 1e-3),
                                        c = agreement_with(two_terms, 1e-3),
                                        d = agreement_with(CpuRoundings::cuda_default(), 1e-3);
  std::cout << GetParam() << " (bf16 rows in one-row e4m3 walks): " << a.describe() << "\n"
            << GetParam() << " (one term): " << b.describe() << "\n"
            << GetParam() << " (two terms): " << c.describe() << "\n"
            << GetParam() << " (the default: f16 rows, three terms): " << d.describe() << "\n";
  EXPECT_LT(a.agreement(), 0.99);
  EXPECT_LT(b.agreement(), 0.97);
  EXPECT_LE(c.num_agree, d.num_agree);
  EXPECT_GE(d.agreement(), 0.99);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LongReferenceTest, ::testing::Values("tiny_v3", "tiny_v2_lite", "tiny_v3_fp8"));
// Only tiny_v3_fp8 has e4m3 weights.
INSTANTIATE_TEST_SUITE_P(Fixtures, LongReferenceFp8Test, ::testing::Values("tiny_v3_fp8"));

}  // namespace
}  // namespace dsinfer
