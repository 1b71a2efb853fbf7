// A one-token step's routed down product with the MoE combine in its blocks, each block taking a
// few quads of columns of every routed expert (launch_few_row_down_combine): the residual, the
// norm's output, its bf16 copy and the squares' partials are the bits of the down product and the
// combine launched apart (launch_few_row_gemm, then launch_moe_combine_residual), and the host's
// sums, for bf16 and e4m3 weights at one and two phases, at every quad count a block may take.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/grouped_gemm.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "few_row_test_support.h"

namespace dsinfer {
namespace {

using testing_cuda::DeviceMemory;
using testing_cuda::ExpertTable;
using testing_cuda::download_floats;
using testing_cuda::PackedWeight;
using testing_cuda::XRows;

struct DownCase {
  bool fp8;
  int k;  // the experts' intermediate size: bf16 1,408 and 2,048 walk two phases, e4m3 2,816 too
};

std::string name_of(const DownCase& c) { return std::string(c.fp8 ? "e4m3" : "bf16") + ", K " + std::to_string(c.k); }

class CudaDownCombineTest : public ::testing::TestWithParam<DownCase> {
 protected:
  void SetUp() override {
    if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

// What a combine writes, downloaded.
struct NormRows {
  std::vector<float> x, out, partials;
  std::vector<uint16_t> out_bf16;
};

TEST_P(CudaDownCombineTest, BlocksOfEveryExpertGiveTheSeparateLaunchesBits) {
  const DownCase c = GetParam();
  SCOPED_TRACE(name_of(c));
  // One token routed to six of eight experts, its slots in another order than the experts' rows
  // (rows follow the experts' ids); hidden 512 columns (128 quads).
  constexpr int kExperts = 8, kTopK = 6, kHidden = 512;
  const std::vector<int> slot_expert = {5, 1, 7, 2, 4, 0};
  const std::vector<int> row_expert = {0, 1, 2, 4, 5, 7};
  DeviceMemory d;
  const ExpertTable table(kExperts, kHidden, c.k, c.fp8, 60, d);
  const std::vector<PackedWeight>& experts = table.experts;
  const XRows x(kTopK, c.k, 70, /*f32=*/true);

  cuda::GroupedGemmArgs a;
  x.read_by(a, d);
  a.groups = table.groups;
  a.row_offsets = d.copy_of(std::vector<int32_t>{0, 1, 2, 3, 3, 4, 5, 5, 6});
  a.block_offsets = d.copy_of(std::vector<int32_t>{0, 1, 2, 3, 3, 4, 5, 5, 6});
  a.num_groups = kExperts;
  a.layout_before_wait = true;
  a.weights_fp8 = c.fp8;
  a.weights_evict_first = true;
  a.epilogue = cuda::GemmEpilogue::kStoreF32;
  a.ldy = kHidden;
  a.n_out = kHidden;
  const int max_row_blocks = static_cast<int>(cuda::grouped_max_row_blocks(kTopK, a.rows_per_block, kExperts));

  std::vector<int32_t> slot_row(kTopK);
  for (int k = 0; k < kTopK; ++k)
    slot_row[k] = static_cast<int32_t>(std::find(row_expert.begin(), row_expert.end(), slot_expert[k]) -
                                       row_expert.begin());
  const std::vector<float> slot_weights = testing_cuda::random_values(kTopK, 71, 0.3f, 0.5f);
  const std::vector<float> shared = testing_cuda::random_values(kHidden, 72);
  const std::vector<float> residual = testing_cuda::random_values(kHidden, 73);
  const std::vector<float> norm_w = testing_cuda::random_values(kHidden, 74, 0.1f, 1.0f);
  cuda::MoeCombineRows rows;
  rows.expert_out = d.garbage(size_t{kTopK} * kHidden * sizeof(float));
  rows.ld_expert = kHidden;
  rows.slot_row = d.copy_of(slot_row);
  rows.weights = d.copy_of(slot_weights);
  rows.shared = d.copy_of(shared);
  rows.top_k = kTopK;
  a.y = const_cast<void*>(rows.expert_out);
  ASSERT_TRUE(cuda::few_row_down_combine_fits(a, max_row_blocks, rows, kHidden));

  auto new_output = [&] {
    cuda::ResidualNormOutput r;
    r.x = d.copy_of(residual);
    r.w = d.copy_of(norm_w);
    r.out = static_cast<float*>(d.garbage(kHidden * sizeof(float)));
    r.out_bf16 = static_cast<uint16_t*>(d.garbage(kHidden * sizeof(uint16_t)));
    r.partials = static_cast<float*>(d.garbage(kHidden / 4 * sizeof(float)));
    return r;
  };
  auto download = [&](const cuda::ResidualNormOutput& r) {
    NormRows n;
    n.x = download_floats(r.x, kHidden);
    n.out = download_floats(r.out, kHidden);
    n.partials = download_floats(r.partials, kHidden / 4);
    n.out_bf16.resize(kHidden);
    EXPECT_EQ(cudaMemcpy(n.out_bf16.data(), r.out_bf16, kHidden * sizeof(uint16_t), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return n;
  };

  const cuda::ResidualNormOutput apart = new_output();
  cuda::launch_few_row_gemm(a, kHidden, max_row_blocks, 1, nullptr);
  cuda::launch_moe_combine_residual(rows, 1, kHidden, apart, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const NormRows want = download(apart);

  // 0: one wave's choice; 3 leaves the last block two quads; 8 is the most.
  for (const int quads : {0, 1, 2, 3, 8}) {
    SCOPED_TRACE("quads a block " + std::to_string(quads));
    const cuda::ResidualNormOutput together = new_output();
    cuda::launch_few_row_down_combine(a, kHidden, max_row_blocks, rows, kHidden, together, quads, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const NormRows got = download(together);
    EXPECT_EQ(got.x, want.x) << "residual";
    EXPECT_EQ(got.out, want.out) << "the norm's output before its factor";
    EXPECT_EQ(got.out_bf16, want.out_bf16) << "its bf16 copy";
    EXPECT_EQ(got.partials, want.partials) << "the squares' partials";
  }

  // The host's sums: the residual plus the shared row and the weighted experts' rows (the e4m3
  // walk's f16 pairs within 2e-3, fp32 within 2e-5 of the scale).
  std::vector<float> host(kHidden);
  for (int col = 0; col < kHidden; ++col) {
    double sum = residual[col] + shared[col];
    for (int k = 0; k < kTopK; ++k) {
      const PackedWeight& w = experts[slot_expert[k]];
      const float* xr = x.values.data() + slot_row[k] * c.k;
      double dot = 0;
      for (int i = 0; i < c.k; ++i) dot += static_cast<double>(w.values[col * c.k + i]) * xr[i];
      sum += slot_weights[k] * dot;
    }
    host[col] = static_cast<float>(sum);
  }
  EXPECT_LT(testing_cuda::relative_error(want.x, host), c.fp8 ? 2e-3 : 2e-5);
}

TEST(CudaDownCombineFitTest, WalksOfMoreThanTwoPhasesOrBeyondEightSlotsKeepTheArrivals) {
  cuda::GroupedGemmArgs a;
  cuda::GemmWeight w;
  a.groups = &w;  // only its presence is checked
  a.num_groups = 64;
  a.layout_before_wait = true;
  a.epilogue = cuda::GemmEpilogue::kStoreF32;
  a.x_f32 = reinterpret_cast<const float*>(uintptr_t{256});
  a.ldx_f32 = 1416;
  a.x_f32_cols = 1408;
  a.ldx = 1408;
  cuda::MoeCombineRows rows;
  rows.expert_out = a.x_f32;
  rows.ld_expert = 2048;
  rows.top_k = 6;
  EXPECT_TRUE(cuda::few_row_down_combine_fits(a, 6, rows, 2048));
  EXPECT_FALSE(cuda::few_row_down_combine_fits(a, 9, rows, 2048)) << "nine row-blocks";
  a.ldx = 2816;  // three bf16 phases
  EXPECT_FALSE(cuda::few_row_down_combine_fits(a, 6, rows, 2048)) << "three phases";
  a.weights_fp8 = true;  // two e4m3 phases
  EXPECT_TRUE(cuda::few_row_down_combine_fits(a, 6, rows, 2048));
  a.few_row_mma = true;
  EXPECT_FALSE(cuda::few_row_down_combine_fits(a, 6, rows, 2048)) << "the tensor-core form";
  a.few_row_mma = false;
  a.x_f32 = nullptr;
  EXPECT_FALSE(cuda::few_row_down_combine_fits(a, 6, rows, 2048)) << "bf16 rows";
}

// bf16: 1,408 (two phases, V2-Lite's), 512 (one), 2,048 (two, whole); e4m3: 1,408 (one, V2-Lite's),
// 2,048 (one, V3's), 2,816 (two).
INSTANTIATE_TEST_SUITE_P(Walks, CudaDownCombineTest,
                         ::testing::Values(DownCase{false, 1408}, DownCase{false, 512}, DownCase{false, 2048},
                                           DownCase{true, 1408}, DownCase{true, 2048}, DownCase{true, 2816}));

}  // namespace
}  // namespace dsinfer
