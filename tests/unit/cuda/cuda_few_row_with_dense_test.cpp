// A grouped few-row product and a dense one of one row in one launch
// (launch_few_row_gemm_with_dense): the bits of their own launches, and the host's sums, for
// bf16 and e4m3 weights, at every pair of phase counts compiled together and at one that is not
// (two launches then), with either epilogue of the routed products, and from x's fp32 rows
// (GroupedGemmArgs::x_f32; over e4m3 weights as f16 pairs) with SiLU·up written in fp32.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/grouped_gemm.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace dsinfer {
namespace {

using testing_cuda::random_values;

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

std::vector<float> download_floats(const void* p, size_t count) {
  std::vector<float> v(count);
  EXPECT_EQ(cudaMemcpy(v.data(), p, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// The routed product's outputs as floats (bf16 ones widened).
std::vector<float> download_outputs(const void* p, size_t count, bool bf16) {
  if (!bf16) return download_floats(p, count);
  std::vector<uint16_t> h(count);
  EXPECT_EQ(cudaMemcpy(h.data(), p, count * sizeof(uint16_t), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = bf16_to_f32(h[i]);
  return v;
}

struct PairCase {
  bool fp8;
  int routed_k, shared_k;
  bool gate_up;  // the routed product is a gate/up one (SiLU·up, bf16 out), else a down one (fp32 out)
  bool f32_rows = false;  // both read fp32 rows, SiLU·up out in fp32
};

std::string name_of(const PairCase& c) {
  return std::string(c.fp8 ? "e4m3" : "bf16") + ", routed K " + std::to_string(c.routed_k) + ", shared K " +
         std::to_string(c.shared_k) + (c.gate_up ? ", gate/up" : ", down") + (c.f32_rows ? ", fp32 rows" : "");
}

class CudaFewRowWithDenseTest : public ::testing::TestWithParam<PairCase> {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_P(CudaFewRowWithDenseTest, OneLaunchGivesEachProductsOwnBits) {
  const PairCase c = GetParam();
  SCOPED_TRACE(name_of(c));
  // One token routed to experts 0, 2 and 3 of four: three one-row groups, one empty.
  constexpr int kExperts = 4, kRouted = 3, kRoutedRows = 128, kSharedRows = 256;
  const std::vector<int> token_experts = {0, 2, 3};
  DeviceMemory d;
  std::vector<PackedWeight> experts;
  std::vector<cuda::GemmWeight> table;
  for (int e = 0; e < kExperts; ++e) {
    experts.emplace_back(kRoutedRows, c.routed_k, c.fp8, 40 + e);
    table.push_back(experts.back().on(d));
  }
  const PackedWeight shared(kSharedRows, c.shared_k, c.fp8, 50);
  const XRows routed_x(kRouted, c.routed_k, 51, c.f32_rows), shared_x(1, c.shared_k, 52, c.f32_rows);
  const bool out_bf16 = c.gate_up && !c.f32_rows;

  cuda::GroupedGemmArgs routed;
  routed_x.read_by(routed, d);
  std::vector<char> table_bytes(sizeof(cuda::GemmWeight) * table.size());
  std::memcpy(table_bytes.data(), table.data(), table_bytes.size());
  routed.groups = reinterpret_cast<const cuda::GemmWeight*>(d.copy_of(table_bytes));
  routed.row_offsets = d.copy_of(std::vector<int32_t>{0, 1, 1, 2, 3});
  routed.block_offsets = d.copy_of(std::vector<int32_t>{0, 1, 1, 2, 3});
  routed.num_groups = kExperts;
  routed.layout_before_wait = !c.gate_up;
  routed.weights_fp8 = c.fp8;
  routed.epilogue = !c.gate_up   ? cuda::GemmEpilogue::kStoreF32
                    : c.f32_rows ? cuda::GemmEpilogue::kSiluMulF32
                                 : cuda::GemmEpilogue::kSiluMulBf16;
  routed.ldy = c.gate_up ? kRoutedRows / 2 : kRoutedRows;
  routed.n_out = static_cast<int>(routed.ldy);
  const size_t routed_outputs = static_cast<size_t>(kRouted) * routed.ldy;
  const size_t routed_bytes = routed_outputs * (out_bf16 ? sizeof(uint16_t) : sizeof(float));

  cuda::GroupedGemmArgs dense;
  shared_x.read_by(dense, d);
  dense.dense = shared.on(d);
  dense.dense_rows = 1;
  dense.weights_fp8 = c.fp8;
  dense.epilogue = cuda::GemmEpilogue::kStoreF32;
  dense.ldy = kSharedRows;
  dense.n_out = kSharedRows;

  const int max_row_blocks = static_cast<int>(cuda::grouped_max_row_blocks(kRouted, routed.rows_per_block, kExperts));
  std::vector<float> got[2][2];  // [own launches, one launch][routed, shared]
  for (int one_launch = 0; one_launch < 2; ++one_launch) {
    routed.y = d.garbage(routed_bytes);
    dense.y = d.garbage(kSharedRows * sizeof(float));
    if (one_launch) {
      cuda::launch_few_row_gemm_with_dense(routed, kRoutedRows, max_row_blocks, dense, nullptr);
    } else {
      cuda::launch_few_row_gemm(routed, kRoutedRows, max_row_blocks, 1, nullptr);
      cuda::launch_few_row_gemm(dense, kSharedRows, 1, 1, nullptr);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    got[one_launch][0] = download_outputs(routed.y, routed_outputs, out_bf16);
    got[one_launch][1] = download_floats(dense.y, kSharedRows);
  }
  EXPECT_EQ(got[1][0], got[0][0]) << "routed product";
  EXPECT_EQ(got[1][1], got[0][1]) << "shared product";

  // The host's sums: fp32 ones within 2e-5 of the scale, the e4m3 fixed walks' f16 pairs within
  // 2e-3 (few_row_gemm.cuh), SiLU·up's bf16 rounding within 1e-2 (fp32 SiLU·up: 2e-5).
  auto dot = [](const float* w, const float* x, int k) {
    double s = 0;
    for (int i = 0; i < k; ++i) s += static_cast<double>(w[i]) * x[i];
    return s;
  };
  std::vector<float> want_routed(routed_outputs), want_shared(kSharedRows);
  for (int r = 0; r < kRouted; ++r) {
    const PackedWeight& w = experts[token_experts[r]];
    const float* x = routed_x.values.data() + r * c.routed_k;
    for (int o = 0; o < routed.n_out; ++o) {
      if (!c.gate_up) {
        want_routed[r * routed.ldy + o] = static_cast<float>(dot(w.values.data() + o * c.routed_k, x, c.routed_k));
        continue;
      }
      // Output o's gate and up rows, interleaved 16 at a time within each 32-row tile.
      const int gate_row = (o / 16) * 32 + o % 16, up_row = gate_row + 16;
      const double g = dot(w.values.data() + gate_row * c.routed_k, x, c.routed_k);
      const double u = dot(w.values.data() + up_row * c.routed_k, x, c.routed_k);
      want_routed[r * routed.ldy + o] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
    }
  }
  for (int o = 0; o < kSharedRows; ++o)
    want_shared[o] = static_cast<float>(dot(shared.values.data() + o * c.shared_k, shared_x.values.data(), c.shared_k));
  const double routed_tolerance = out_bf16 ? 1e-2 : c.fp8 ? 2e-3 : 2e-5;
  EXPECT_LT(testing_cuda::relative_error(got[1][0], want_routed), routed_tolerance);
  EXPECT_LT(testing_cuda::relative_error(got[1][1], want_shared), c.fp8 ? 2e-3 : 2e-5);
}

// Phase counts (few_row_phases.h; a phase is 1,024 bf16 or 2,048 e4m3 columns, three walked as
// four): bf16 (2, 4) as V2-Lite's down products, (1, 1), (1, 2), (2, 2); e4m3 (1, 2) as V2-Lite's,
// (1, 1), (2, 4) with the shared x in shared memory; bf16 (4, 2), which is not compiled together;
// bf16 from fp32 rows at (2, 4) and (1, 2), a gate/up pair, and (4, 2) in two launches.
INSTANTIATE_TEST_SUITE_P(Pairs, CudaFewRowWithDenseTest,
                         ::testing::Values(PairCase{false, 1408, 2816, false}, PairCase{false, 512, 1024, false},
                                           PairCase{false, 1024, 2048, false}, PairCase{false, 2048, 1408, false},
                                           PairCase{false, 2048, 2816, true}, PairCase{true, 1408, 2816, false},
                                           PairCase{true, 2048, 2048, false}, PairCase{true, 4096, 7168, false},
                                           PairCase{true, 2048, 2816, true}, PairCase{false, 2816, 1408, false},
                                           PairCase{false, 1408, 2816, false, true},
                                           PairCase{false, 512, 1024, false, true},
                                           PairCase{false, 2048, 2816, true, true},
                                           PairCase{false, 2816, 1408, false, true},
                                           PairCase{true, 1408, 2816, false, true},
                                           PairCase{true, 2048, 2816, true, true},
                                           PairCase{true, 4096, 7168, false, true}));

}  // namespace
}  // namespace dsinfer
