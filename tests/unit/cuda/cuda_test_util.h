// Helpers for the CUDA-vs-CPU tests: random host data, upload to a backend, error measures.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "engine/engine_config.h"
#include "source_dir.h"

namespace dsinfer::testing_cuda {

// Normal values (never all zeros) with an optional offset, reproducible from the seed.
inline std::vector<float> random_values(size_t n, uint32_t seed, float stddev = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Weight values as a bf16 checkpoint holds them (each exact in bf16): the CUDA backend packs such
// weights in one bf16 term, the form whose kernels most tests here check (dense weights that bf16
// would round take two terms, weight_terms; cuda_two_term_weights_test.cpp).
inline std::vector<float> bf16_values(std::vector<float> v) {
  for (float& x : v) x = round_to_bf16(x);
  return v;
}

// Sets an environment variable for the scope (the CUDA backend reads its switches when made).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// A backend made while the environment variable `name` holds `value` (backends read their
// switches when made); the variable is unset again.
inline std::unique_ptr<Backend> make_backend_with_env(const std::string& backend, const char* name,
                                                      const char* value) {
  ScopedEnv env(name, value);
  return make_backend(backend);
}

inline Tensor upload(Backend& be, const std::vector<int64_t>& shape, const std::vector<float>& v) {
  return be.from_host(HostTensor{DType::kF32, shape, v.data()});
}

inline std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<float> v(t.num_elements());
  be.to_host(t, v.data());
  return v;
}

// max |got - want| / max |want|: the error relative to the result's scale.
inline double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::abs(got[i] - want[i])));
    max_ref = std::max(max_ref, static_cast<double>(std::abs(want[i])));
  }
  EXPECT_GT(max_ref, 0.0) << "reference result is all zeros: the comparison would prove nothing";
  return max_diff / std::max(max_ref, 1e-30);
}

using dsinfer::test_support::source_dir;

// An engine on the CUDA backend over the tiny_v3 fixture, with a 256 MiB KV cache.
inline EngineConfig tiny_v3_cuda_config() {
  EngineConfig c;
  c.model_dir = source_dir() + "/tests/data/tiny_v3";
  c.backend = "cuda";
  c.kv_cache_bytes = 256 << 20;
  c.print_load_progress = false;
  return c;
}

class CudaVsCpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
    cpu_ = make_backend("cpu");
    gpu_ = make_backend("cuda");
  }
  std::unique_ptr<Backend> cpu_, gpu_;
};

// CudaVsCpuTest whose backends take DeepSeek's FP8 activations in one e4m3 term at every row
// count (DSINFER_FP8_ACTIVATION_TERMS=1), the recipe's own arithmetic, but where a test sets it
// otherwise: the default's terms in steps that carry a prompt are checked on their own.
class CudaVsCpuOneTermTest : public CudaVsCpuTest {
 protected:
  void SetUp() override {
    setenv("DSINFER_FP8_ACTIVATION_TERMS", "1", 1);
    CudaVsCpuTest::SetUp();
  }
  void TearDown() override { unsetenv("DSINFER_FP8_ACTIVATION_TERMS"); }
};

}  // namespace dsinfer::testing_cuda
