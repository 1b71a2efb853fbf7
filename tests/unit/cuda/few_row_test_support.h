// Device buffers, packed weights and x rows for the few-row products' tests
// (cuda_few_row_with_dense_test.cpp, cuda_down_combine_test.cpp).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/grouped_gemm.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace dsinfer::testing_cuda {

// Device memory of a test, freed on every path out of it.
class DeviceMemory {
 public:
  ~DeviceMemory() {
    for (void* p : blocks_) cudaFree(p);
  }
  template <typename T>
  T* copy_of(const std::vector<T>& host) {
    T* p = static_cast<T*>(alloc(host.size() * sizeof(T)));
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    return p;
  }
  // Bytes that hold no result of a product (0x7f: a NaN in every fp32 and bf16 slot).
  void* garbage(size_t bytes) {
    void* p = alloc(bytes);
    EXPECT_EQ(cudaMemset(p, 0x7f, bytes), cudaSuccess);
    return p;
  }

 private:
  void* alloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    blocks_.push_back(p);
    return p;
  }
  std::vector<void*> blocks_;
};

// A weight [n, k] in the kernel's layout (k a multiple of 32, n of 32; no padding needed), with
// its values as the product reads them.
struct PackedWeight {
  PackedWeight(int n_rows, int k_cols, bool fp8, uint32_t seed) : n(n_rows), k(k_cols), values(n_rows * k_cols) {
    const auto real = random_values(values.size(), seed, fp8 ? 100.0f : 0.05f);
    const int scale_cols = (k + 127) / 128;
    if (fp8) {
      scales.resize((n / 16) * scale_cols);
      for (size_t i = 0; i < scales.size(); ++i) scales[i] = 1e-4f * (1.0f + static_cast<float>(i % 7));
      bytes.resize(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        bytes[i] = f32_to_fp8e4m3(real[i]);
        const int64_t row = static_cast<int64_t>(i) / k, col = static_cast<int64_t>(i) % k;
        values[i] = fp8e4m3_to_f32(bytes[i]) * scales[(row / 16) * scale_cols + col / 128];
      }
    } else {
      halves.resize(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        halves[i] = f32_to_bf16(real[i]);
        values[i] = bf16_to_f32(halves[i]);
      }
    }
  }
  cuda::GemmWeight on(DeviceMemory& d) const {
    cuda::GemmWeight g;
    g.data = bytes.empty() ? static_cast<const void*>(d.copy_of(halves)) : d.copy_of(bytes);
    g.scales = scales.empty() ? nullptr : d.copy_of(scales);
    g.n_padded = n;
    g.k_padded = k;
    return g;
  }

  int n, k;
  std::vector<float> values;
  std::vector<uint16_t> halves;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
};

// Experts' weights [n, k] and the table of them a grouped product reads (GroupedGemmArgs::groups).
struct ExpertTable {
  ExpertTable(int num_experts, int n, int k, bool fp8, uint32_t first_seed, DeviceMemory& d) {
    std::vector<cuda::GemmWeight> table;
    for (int e = 0; e < num_experts; ++e) {
      experts.emplace_back(n, k, fp8, first_seed + e);
      table.push_back(experts.back().on(d));
    }
    std::vector<char> bytes(sizeof(cuda::GemmWeight) * table.size());
    std::memcpy(bytes.data(), table.data(), bytes.size());
    groups = reinterpret_cast<const cuda::GemmWeight*>(d.copy_of(bytes));
  }
  std::vector<PackedWeight> experts;
  const cuda::GemmWeight* groups = nullptr;
};

// Rows [rows, k] in bf16 and their values, or (f32) in fp32 [rows, k + 8], each row's last
// eight columns NaN, past the columns a product reads.
struct XRows {
  XRows(int rows, int k_cols, uint32_t seed, bool f32)
      : k(k_cols), halves(rows * k_cols), values(random_values(rows * k_cols, seed)) {
    if (f32) {
      floats.assign(static_cast<size_t>(rows) * (k + 8), std::nanf(""));
      for (int r = 0; r < rows; ++r) std::copy_n(values.begin() + r * k, k, floats.begin() + r * (k + 8));
      return;
    }
    for (size_t i = 0; i < values.size(); ++i) {
      halves[i] = f32_to_bf16(values[i]);
      values[i] = bf16_to_f32(halves[i]);
    }
  }
  // a reads these rows.
  void read_by(cuda::GroupedGemmArgs& a, DeviceMemory& d) const {
    a.ldx = k;
    if (floats.empty()) {
      a.x = d.copy_of(halves);
      return;
    }
    a.x_f32 = d.copy_of(floats);
    a.ldx_f32 = k + 8;
    a.x_f32_cols = k;
  }
  int k;
  std::vector<uint16_t> halves;
  std::vector<float> values, floats;
};

inline std::vector<float> download_floats(const void* p, size_t count) {
  std::vector<float> v(count);
  EXPECT_EQ(cudaMemcpy(v.data(), p, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// The routed product's outputs as floats (bf16 ones widened).
inline std::vector<float> download_outputs(const void* p, size_t count, bool bf16) {
  if (!bf16) return download_floats(p, count);
  std::vector<uint16_t> h(count);
  EXPECT_EQ(cudaMemcpy(h.data(), p, count * sizeof(uint16_t), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = bf16_to_f32(h[i]);
  return v;
}

}  // namespace dsinfer::testing_cuda
