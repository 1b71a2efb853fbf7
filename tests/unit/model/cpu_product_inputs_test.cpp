// The CPU backend's product inputs (DSINFER_CPU_PRODUCT_INPUTS, CpuBackend::ProductInputs): read
// from the environment by make_backend("cpu"), applied to linear()'s inputs where asked (in bf16
// or f16, one-row sums in f16 pairs), and a value it does not know refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/status.h"

namespace dsinfer {
namespace {

// The product of rows of x_value (by default 1 + 2^-10: below bf16's precision, it rounds to 1, and
// within f16's) with a one-element weight (by default 1), on a CPU backend made with
// DSINFER_CPU_PRODUCT_INPUTS=value (unset where null), the rows gathered from a step of step_rows
// rows (rows where 0).
std::vector<float> product_of_rows(const char* value, int rows, float x_value = 1.0f + 1.0f / 1024.0f,
                                   float weight = 1.0f, int step_rows = 0) {
  if (value != nullptr) setenv("DSINFER_CPU_PRODUCT_INPUTS", value, 1);
  else unsetenv("DSINFER_CPU_PRODUCT_INPUTS");
  auto backend = make_backend("cpu");
  unsetenv("DSINFER_CPU_PRODUCT_INPUTS");
  const LinearWeight w = backend->make_linear(HostTensor{DType::kF32, {1, 1}, &weight});
  const std::vector<float> x_host(rows, x_value);
  Tensor x = backend->from_host(HostTensor{DType::kF32, {rows, 1}, x_host.data()});
  Tensor out = backend->empty({rows, 1}, DType::kF32);
  if (step_rows == 0) backend->linear(x, w, out);
  else dynamic_cast<CpuBackend&>(*backend).linear_in_step(x, w, out, step_rows);
  std::vector<float> y(rows);
  backend->to_host(out, y.data());
  return y;
}

// make_backend("cpu") refuses each of `values` for the variable `name`, with an error that names
// it; `name` is unset after.
void expect_values_refused(const char* name, std::initializer_list<const char*> values) {
  for (const char* value : values) {
    setenv(name, value, 1);
    try {
      (void)make_backend("cpu");
      ADD_FAILURE() << name << "='" << value << "' was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(value), std::string::npos) << e.what();
    }
  }
  unsetenv(name);
}

TEST(CpuProductInputsTest, EnvironmentPicksWhereAndHowInputsAreRounded) {
  const float exact = 1.0f + 1.0f / 1024.0f;
  EXPECT_EQ(product_of_rows(nullptr, 2), std::vector<float>(2, exact));
  EXPECT_EQ(product_of_rows("fp32", 2), std::vector<float>(2, exact));
  EXPECT_EQ(product_of_rows("bf16", 1), std::vector<float>(1, 1.0f));
  EXPECT_EQ(product_of_rows("bf16", 2), std::vector<float>(2, 1.0f));
  EXPECT_EQ(product_of_rows("bf16-multirow", 1), std::vector<float>(1, exact));
  EXPECT_EQ(product_of_rows("bf16-multirow", 2), std::vector<float>(2, 1.0f));
  // An expert's one row from a step of two rounds as its step's products do; from a step of one
  // it keeps fp32's.
  EXPECT_EQ(product_of_rows("bf16-multirow", 1, 1.0f + 1.0f / 1024.0f, 1.0f, 2), std::vector<float>(1, 1.0f));
  EXPECT_EQ(product_of_rows("bf16-multirow", 1, 1.0f + 1.0f / 1024.0f, 1.0f, 1), std::vector<float>(1, exact));
  // f16 keeps ten mantissa bits in every product: 1 + 2^-10 stays, 1 + 2^-12 rounds to 1.
  EXPECT_EQ(product_of_rows("f16", 1), std::vector<float>(1, exact));
  EXPECT_EQ(product_of_rows("f16", 2, 1.0f + 1.0f / 4096.0f), std::vector<float>(2, 1.0f));
  EXPECT_EQ(product_of_rows("fp32", 2, 1.0f + 1.0f / 4096.0f), std::vector<float>(2, 1.0f + 1.0f / 4096.0f));
  // f16-multirow: f16 in steps of two rows or more, fp32 in one-row steps.
  EXPECT_EQ(product_of_rows("f16-multirow", 2, 1.0f + 1.0f / 4096.0f), std::vector<float>(2, 1.0f));
  EXPECT_EQ(product_of_rows("f16-multirow", 1, 1.0f + 1.0f / 4096.0f), std::vector<float>(1, 1.0f + 1.0f / 4096.0f));
  EXPECT_EQ(product_of_rows("f16-multirow", 1, 1.0f + 1.0f / 4096.0f, 1.0f, 3), std::vector<float>(1, 1.0f));
  // f16-pairs also rounds one-row products to f16: 3 (1 + 2^-10) = 3 + 1.5 · 2^-9 lies halfway
  // between two f16 values and goes to the even one, 3 + 2^-8; rows of two keep fp32's product.
  const float product = 3.0f + 3.0f / 1024.0f;
  EXPECT_EQ(product_of_rows("f16", 1, exact, 3.0f), std::vector<float>(1, product));
  EXPECT_EQ(product_of_rows("f16-pairs", 1, exact, 3.0f), std::vector<float>(1, 3.0f + 1.0f / 256.0f));
  EXPECT_EQ(product_of_rows("f16-pairs", 2, exact, 3.0f), std::vector<float>(2, product));
}

TEST(CpuProductInputsTest, UnknownValueIsRefused) {
  expect_values_refused("DSINFER_CPU_PRODUCT_INPUTS", {"bf8", "BF16", ""});
}

// The one-row product of 1 + 2^-10 with a 1 × 1 weight (input width 1) on a CPU backend made
// with DSINFER_CPU_PRODUCT_INPUTS=bf16-multirow and DSINFER_CPU_ONE_ROW_BF16=kept, as a routed
// expert's where routed_expert, from a step of step_rows rows.
float one_row_product(const char* kept, bool routed_expert, int step_rows = 1) {
  setenv("DSINFER_CPU_PRODUCT_INPUTS", "bf16-multirow", 1);
  setenv("DSINFER_CPU_ONE_ROW_BF16", kept, 1);
  auto backend = make_backend("cpu");
  unsetenv("DSINFER_CPU_PRODUCT_INPUTS");
  unsetenv("DSINFER_CPU_ONE_ROW_BF16");
  auto& cpu = dynamic_cast<CpuBackend&>(*backend);
  const float weight = 1.0f, x_value = 1.0f + 1.0f / 1024.0f;
  const LinearWeight w = cpu.make_linear(HostTensor{DType::kF32, {1, 1}, &weight});
  Tensor x = cpu.from_host(HostTensor{DType::kF32, {1, 1}, &x_value});
  Tensor out = cpu.empty({1, 1}, DType::kF32);
  cpu.linear_in_step(x, w, out, step_rows, routed_expert);
  float y = 0;
  cpu.to_host(out, &y);
  return y;
}

// DSINFER_CPU_ONE_ROW_BF16 keeps bf16 inputs in the one-row products it names, by input width
// (products other than the routed experts'), `routed` or `e4m3` (products over e4m3 weights); the
// others keep fp32's, and steps of two rows round as bf16-multirow does anyway.
TEST(CpuProductInputsTest, OneRowProductsKeptInBf16ByWidthOrRoutedExperts) {
  const float exact = 1.0f + 1.0f / 1024.0f, rounded = 1.0f;
  EXPECT_EQ(one_row_product("1", false), rounded);
  EXPECT_EQ(one_row_product("1", true), exact);
  EXPECT_EQ(one_row_product("2,3", false), exact);
  EXPECT_EQ(one_row_product("routed", true), rounded);
  EXPECT_EQ(one_row_product("routed", false), exact);
  EXPECT_EQ(one_row_product("routed,7,1", false), rounded);
  EXPECT_EQ(one_row_product("2", false, 2), rounded);
  EXPECT_EQ(one_row_product("e4m3", false), exact);  // the weight is fp32
  const CpuRoundings r = [] {
    setenv("DSINFER_CPU_PRODUCT_INPUTS", "bf16-multirow", 1);
    setenv("DSINFER_CPU_ONE_ROW_BF16", "64,routed,e4m3,48", 1);
    auto backend = make_backend("cpu");
    unsetenv("DSINFER_CPU_PRODUCT_INPUTS");
    unsetenv("DSINFER_CPU_ONE_ROW_BF16");
    return dynamic_cast<CpuBackend&>(*backend).roundings();
  }();
  EXPECT_TRUE(r.one_row_bf16.routed_experts);
  EXPECT_TRUE(r.one_row_bf16.e4m3_weights);
  EXPECT_EQ(r.one_row_bf16.input_widths, (std::vector<int64_t>{64, 48}));
  // e4m3 weights' products are kept whatever their width or kind; others by those.
  const CpuOneRowBf16 e4m3_only{.routed_experts = false, .input_widths = {}, .e4m3_weights = true};
  EXPECT_TRUE(e4m3_only.takes(7, /*routed_expert=*/false, /*e4m3_weight=*/true));
  EXPECT_TRUE(e4m3_only.takes(7, /*routed_expert=*/true, /*e4m3_weight=*/true));
  EXPECT_FALSE(e4m3_only.takes(7, /*routed_expert=*/true, /*e4m3_weight=*/false));
  EXPECT_FALSE(e4m3_only.takes(7, /*routed_expert=*/false, /*e4m3_weight=*/false));
}

// The CUDA default path's roundings: bf16-multirow, with the one-row products over e4m3 weights
// on f16 pairs (the few-row kernel's e4m3 walks on fp32 rows), FP8 activations where the CUDA
// backend takes them, in three terms in dense steps of up to 256 rows.
TEST(CpuProductInputsTest, CudaDefaultRoundings) {
  const CpuRoundings r = CpuRoundings::cuda_default();
  EXPECT_EQ(r.product_inputs, CpuProductInputs::kBf16MultiRow);
  EXPECT_TRUE(r.one_row_e4m3_f16_pairs);
  EXPECT_FALSE(r.one_row_bf16.e4m3_weights);
  EXPECT_FALSE(r.one_row_bf16.routed_experts);
  EXPECT_TRUE(r.one_row_bf16.input_widths.empty());
  EXPECT_EQ(r.fp8_activations.dense_min_rows, 33);
  EXPECT_EQ(r.fp8_activations.routed_min_rows, 3);
  EXPECT_EQ(r.fp8_activations.dense_terms, 3);
  EXPECT_EQ(r.fp8_activations.dense_terms_max_rows, 256);
  EXPECT_TRUE(r.bf16_routed_expert_weights);
  EXPECT_TRUE(CpuBackend(r).wants_raw_fp8());
}

// bf16_routed_expert_weights keeps a routed expert's weight values in bf16, as the CUDA backend
// packs them: a float16 checkpoint's 1 + 2^-10 becomes 1. Other linear weights (which the CUDA
// backend packs in two bf16 terms), e4m3 weights and the tensors that are no linear weight
// (norms, embeddings) keep their values.
TEST(CpuProductInputsTest, Bf16RoutedExpertWeights) {
  CpuRoundings roundings;
  roundings.bf16_routed_expert_weights = true;
  CpuBackend cpu(roundings);
  const float w_value = 1.0f + 1.0f / 1024.0f, x_value = 1.0f;
  auto product = [&](const LinearWeight& w) {
    Tensor x = cpu.from_host(HostTensor{DType::kF32, {1, 1}, &x_value});
    Tensor out = cpu.empty({1, 1}, DType::kF32);
    cpu.linear(x, w, out);
    float y = 0;
    cpu.to_host(out, &y);
    return y;
  };
  HostTensor expert{DType::kF32, {1, 1}, &w_value};
  expert.routed_expert = true;
  EXPECT_EQ(product(cpu.make_linear(expert)), 1.0f);
  EXPECT_EQ(product(CpuBackend().make_linear(expert)), w_value);
  EXPECT_EQ(product(cpu.make_linear(HostTensor{DType::kF32, {1, 1}, &w_value})), w_value);
  const uint8_t code = 0x38;  // e4m3 1.0, under a scale bf16 cannot hold
  const float scale = w_value;
  HostTensor e4m3_expert{DType::kF8E4M3, {1, 1}, &code, &scale, 128, 128};
  e4m3_expert.routed_expert = true;
  EXPECT_EQ(product(cpu.make_linear(e4m3_expert)), w_value);
  float kept = 0;
  cpu.to_host(cpu.from_host(HostTensor{DType::kF32, {1}, &w_value}), &kept);
  EXPECT_EQ(kept, w_value);
}

// One-row products over e4m3 weights under one_row_e4m3_f16_pairs read f16 inputs: 1 + 2^-10 is
// kept (bf16 would round it to 1); steps of two rows keep bf16-multirow's bf16.
TEST(CpuProductInputsTest, OneRowE4m3ProductsOnF16Pairs) {
  CpuRoundings roundings{.product_inputs = CpuProductInputs::kBf16MultiRow};
  roundings.one_row_e4m3_f16_pairs = true;
  CpuBackend cpu(roundings);
  EXPECT_TRUE(cpu.wants_raw_fp8());
  const uint8_t code = 0x38;  // e4m3 1.0
  const float scale = 1.0f, x_value = 1.0f + 1.0f / 1024.0f;
  const LinearWeight w = cpu.make_linear(HostTensor{DType::kF8E4M3, {1, 1}, &code, &scale, 128, 128});
  for (const int rows : {1, 2}) {
    const std::vector<float> x_host(rows, x_value);
    Tensor x = cpu.from_host(HostTensor{DType::kF32, {rows, 1}, x_host.data()});
    Tensor out = cpu.empty({rows, 1}, DType::kF32);
    cpu.linear(x, w, out);
    std::vector<float> y(rows);
    cpu.to_host(out, y.data());
    EXPECT_EQ(y, std::vector<float>(rows, rows == 1 ? x_value : 1.0f)) << rows;
  }
}

TEST(CpuProductInputsTest, MalformedOneRowBf16IsRefused) {
  setenv("DSINFER_CPU_PRODUCT_INPUTS", "bf16-multirow", 1);
  expect_values_refused("DSINFER_CPU_ONE_ROW_BF16", {"", "routed,", "0", "-3", "64x", "1,,2", "experts", "fp8"});
  // With another mode of the product inputs it would change nothing: refused too.
  setenv("DSINFER_CPU_ONE_ROW_BF16", "64", 1);
  for (const char* mode : {"bf16", "fp32", "f16-multirow"}) {
    setenv("DSINFER_CPU_PRODUCT_INPUTS", mode, 1);
    EXPECT_THROW((void)make_backend("cpu"), Error) << mode;
  }
  unsetenv("DSINFER_CPU_PRODUCT_INPUTS");
  unsetenv("DSINFER_CPU_ONE_ROW_BF16");
}

// The product [1, 0.3] · [1, 1]ᵀ over an e4m3 weight (codes of 1, scale 1) for `rows` rows of a
// step of step_rows, on a CPU backend made with DSINFER_CPU_FP8_ACTIVATIONS=value.
std::vector<float> e4m3_product(const char* value, int rows, int step_rows, bool routed_expert) {
  setenv("DSINFER_CPU_FP8_ACTIVATIONS", value, 1);
  auto backend = make_backend("cpu");
  unsetenv("DSINFER_CPU_FP8_ACTIVATIONS");
  auto& cpu = dynamic_cast<CpuBackend&>(*backend);
  EXPECT_TRUE(cpu.wants_raw_fp8());
  EXPECT_FALSE(cpu.roundings().bf16_expanded_attention);
  const uint8_t codes[2] = {0x38, 0x38};  // e4m3 1.0
  const float scale = 1.0f;
  const LinearWeight w = cpu.make_linear(HostTensor{DType::kF8E4M3, {1, 2}, codes, &scale, 128, 128});
  std::vector<float> x_host;
  for (int r = 0; r < rows; ++r) x_host.insert(x_host.end(), {1.0f, 0.3f});
  Tensor x = cpu.from_host(HostTensor{DType::kF32, {rows, 2}, x_host.data()});
  Tensor out = cpu.empty({rows, 1}, DType::kF32);
  cpu.linear_in_step(x, w, out, step_rows, routed_expert);
  std::vector<float> y(rows);
  cpu.to_host(out, y.data());
  return y;
}

// DeepSeek's FP8 activations where DSINFER_CPU_FP8_ACTIVATIONS asks: the row [1, 0.3] under its
// tile's scale 1/448 reads 0.3 as 134.4 / 448, whose nearest e4m3 is 128 (the codes step by 16
// there): 1 + 128/448. Dense products and routed experts go by their own bounds.
TEST(CpuProductInputsTest, Fp8ActivationsFromTheirStepsOnward) {
  const float exact = 1.0f + 0.3f, quantized = 1.0f + 128.0f / 448.0f;
  EXPECT_EQ(e4m3_product("33,3", 1, 32, false), std::vector<float>(1, exact));
  EXPECT_EQ(e4m3_product("33,3", 1, 33, false), std::vector<float>(1, quantized));
  EXPECT_EQ(e4m3_product("33,3", 2, 2, true), std::vector<float>(2, exact));
  EXPECT_EQ(e4m3_product("33,3", 1, 3, true), std::vector<float>(1, quantized));
  // A weight that was not e4m3 keeps its inputs.
  setenv("DSINFER_CPU_FP8_ACTIVATIONS", "1,1", 1);
  auto backend = make_backend("cpu");
  unsetenv("DSINFER_CPU_FP8_ACTIVATIONS");
  const float weights[2] = {1.0f, 1.0f}, x_host[2] = {1.0f, 0.3f};
  const LinearWeight w = backend->make_linear(HostTensor{DType::kF32, {1, 2}, weights});
  Tensor x = backend->from_host(HostTensor{DType::kF32, {1, 2}, x_host});
  Tensor out = backend->empty({1, 1}, DType::kF32);
  backend->linear(x, w, out);
  float y = 0;
  backend->to_host(out, &y);
  EXPECT_EQ(y, exact);
  EXPECT_FALSE(dynamic_cast<CpuBackend&>(*make_backend("cpu")).wants_raw_fp8());
}

// The dense products' activations in e4m3 terms (D,E,T,M): 0.3 rounds to bf16's 0.30078125, term
// 0 holds 128/448 of it, and term 1 the rest, which fills its own tile's scale (the 1 beside it
// left nothing): two terms give the bf16 row. Routed experts take the terms in those steps too
// (from E rows up to M); past M both keep one term.
TEST(CpuProductInputsTest, DenseActivationsInTermsUpToTheirBound) {
  const float bf16_row = 1.0f + 0.30078125f, quantized = 1.0f + 128.0f / 448.0f;
  EXPECT_NEAR(e4m3_product("33,3,2,64", 1, 33, false)[0], bf16_row, 1e-6f);
  EXPECT_NEAR(e4m3_product("33,3,3,64", 1, 64, false)[0], bf16_row, 1e-6f);
  EXPECT_EQ(e4m3_product("33,3,2,64", 1, 65, false), std::vector<float>(1, quantized));
  EXPECT_NEAR(e4m3_product("33,3,2,64", 1, 3, true)[0], bf16_row, 1e-6f);
  EXPECT_EQ(e4m3_product("33,3,2,64", 1, 65, true), std::vector<float>(1, quantized));
  EXPECT_EQ(e4m3_product("33,3,1,64", 1, 3, true), std::vector<float>(1, quantized));
  EXPECT_EQ(e4m3_product("33,3,1,64", 1, 33, false), std::vector<float>(1, quantized));
  EXPECT_EQ(e4m3_product("33,3,2,64", 1, 32, false), std::vector<float>(1, 1.0f + 0.3f));
}

TEST(CpuProductInputsTest, MalformedFp8ActivationsAreRefused) {
  expect_values_refused("DSINFER_CPU_FP8_ACTIVATIONS", {"33", "0,3", "33,3,1", "a,b", "33,-1", "", "33,3,2",
                                                        "33,3,0,64", "33,3,4,64", "33,3,2,32", "33,3,2,64,1"});
}

TEST(CpuProductInputsTest, AttentionRoundingsFromTheEnvironment) {
  struct Switch {
    const char* name;
    const char* rounded;
    bool CpuRoundings::*field;
  };
  const Switch switches[] = {{"DSINFER_CPU_EXPANDED_ATTENTION", "bf16", &CpuRoundings::bf16_expanded_attention},
                             {"DSINFER_CPU_QUERY_TILES", "bf16", &CpuRoundings::bf16_query_tiles},
                             {"DSINFER_CPU_HEAD_TILES", "tf32", &CpuRoundings::tf32_head_tiles}};
  for (const Switch& sw : switches) {
    SCOPED_TRACE(sw.name);
    for (const char* value : {sw.rounded, "fp32"}) {
      setenv(sw.name, value, 1);
      auto backend = make_backend("cpu");
      const CpuRoundings& r = dynamic_cast<CpuBackend&>(*backend).roundings();
      EXPECT_EQ(r.*sw.field, std::string(value) == sw.rounded);
      const int num_on = r.bf16_expanded_attention + r.bf16_query_tiles + r.tf32_head_tiles;
      EXPECT_EQ(num_on, std::string(value) == sw.rounded ? 1 : 0);
    }
    expect_values_refused(sw.name, {"f16"});
  }
}

}  // namespace
}  // namespace dsinfer
