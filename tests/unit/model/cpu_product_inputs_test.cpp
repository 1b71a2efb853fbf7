// The CPU backend's product inputs (DSINFER_CPU_PRODUCT_INPUTS, CpuBackend::ProductInputs): read
// from the environment by make_backend("cpu"), applied to linear()'s inputs where asked (in bf16
// or f16, one-row sums in f16 pairs), and a value it does not know refused.
#include <gtest/gtest.h>

#include <cstdlib>
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
  setenv("DSINFER_CPU_PRODUCT_INPUTS", "bf8", 1);
  try {
    (void)make_backend("cpu");
    ADD_FAILURE() << "an unknown value was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf8"), std::string::npos) << e.what();
  }
  unsetenv("DSINFER_CPU_PRODUCT_INPUTS");
}

}  // namespace
}  // namespace dsinfer
