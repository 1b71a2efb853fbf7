// A grouped few-row product, taken one row a pass, and a dense product of one row in one launch:
// an MoE layer's routed experts' down product and its shared experts' down product at batch 1.
//
// Why: where the router logits are made beside o_proj (RouterIdentity), the shared experts'
// gate/up product runs beside the routing, and their down product was a launch of its own after
// the routed experts: one more link of the layer's chain, whose start and tail leave the memory
// idle for a few µs, for 2,048 × 2,816 weights (V2-Lite). Here its blocks run beside the routed
// product's. Each block is one of few_row_gemm.cu's, so each output has the bits of its own launch.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/few_row_form.cuh"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/kernel_launch.cuh"

namespace dsinfer::cuda {
namespace {

// Blocks [0, grouped_blocks): the grouped product's, grouped_blocks_x of them a row-block (in
// the order of its own launch's grid), of grouped_units units each; the rest: the dense
// product's, of dense_units units each.
template <typename GroupedForm, typename DenseForm>
__global__ void __launch_bounds__(few_row::kThreads, GroupedForm::kMinBlocksPerSm)
    few_row_gemm_with_dense_kernel(GroupedGemmArgs grouped, GroupedGemmArgs dense, int grouped_units,
                                   int dense_units, int grouped_blocks_x, int grouped_blocks) {
  const int b = static_cast<int>(blockIdx.x);
  if (b < grouped_blocks) GroupedForm::run(grouped, grouped_units, b % grouped_blocks_x, b / grouped_blocks_x);
  else DenseForm::run(dense, dense_units, b - grouped_blocks, 0);
}

template <typename GroupedForm, typename DenseForm>
void launch_pair(const GroupedGemmArgs& grouped, int max_n_padded, int max_row_blocks, const GroupedGemmArgs& dense,
                 Stream stream) {
  static_assert(GroupedForm::kUnitRows == DenseForm::kUnitRows && GroupedForm::kMaxUnitsPerBlock ==
                    DenseForm::kMaxUnitsPerBlock && GroupedForm::kMinBlocksPerSm == DenseForm::kMinBlocksPerSm,
                "the two products' blocks take units alike");
  constexpr auto kernel = few_row_gemm_with_dense_kernel<GroupedForm, DenseForm>;
  // One wave over both products' weight columns (a block's time is its weight bytes): each block
  // takes about the columns of an equal share, in units of its product's K. With as many units a
  // block for both, V2-Lite's shared down blocks (K 2,816) took twice the routed ones' (K 1,408)
  // and the launch waited for them: batch-1 decode 2% slower than in two launches.
  const int units_grouped = max_n_padded / GroupedForm::kUnitRows;
  const int units_dense = dense.dense.n_padded / DenseForm::kUnitRows;
  const int64_t grouped_k = std::max<int64_t>(grouped.ldx, 1), dense_k = std::max<int64_t>(dense.dense.k_padded, 1);
  const int64_t columns = units_grouped * grouped_k * max_row_blocks + units_dense * dense_k;
  const int64_t capacity = few_row::resident_blocks<kernel>(0);
  const int64_t share = (columns + capacity - 1) / capacity;
  const auto units_of = [&](int64_t k) {
    return static_cast<int>(std::clamp<int64_t>((share + k - 1) / k, 1, GroupedForm::kMaxUnitsPerBlock));
  };
  const int grouped_units = units_of(grouped_k), dense_units = units_of(dense_k);
  const int grouped_blocks_x = (units_grouped + grouped_units - 1) / grouped_units;
  const int grouped_blocks = grouped_blocks_x * max_row_blocks;
  const int dense_blocks = (units_dense + dense_units - 1) / dense_units;
  launch_kernel(kernel, grouped_blocks + dense_blocks, few_row::kThreads, 0, stream, grouped, dense, grouped_units,
                dense_units, grouped_blocks_x, grouped_blocks);
  DS_CUDA_CHECK_LAUNCH();
}

// The fixed phase count of the CUDA-core block of one row that a product takes alone
// (few_row_form.cuh, with_block_form), or 0 where it takes another form.
int one_row_fixed_phases(const GroupedGemmArgs& a) {
  if (!a.few_row_fixed_phases || (a.weights_fp8 && a.few_row_mma)) return 0;
  return few_row::fixed_phases(a.ldx, a.weights_fp8, 4, 4);
}

// Launches the pair where the two products take the forms of kGroupedPhases and kDensePhases.
template <bool kFp8, bool kXF32, int kGroupedPhases, int kDensePhases>
bool launch_if_phases(int grouped_phases, int dense_phases, const GroupedGemmArgs& grouped, int max_n_padded,
                      int max_row_blocks, const GroupedGemmArgs& dense, Stream stream) {
  if (grouped_phases != kGroupedPhases || dense_phases != kDensePhases) return false;
  launch_pair<few_row::Form<1, kFp8, false, kGroupedPhases, kXF32>,
              few_row::Form<1, kFp8, false, kDensePhases, kXF32>>(grouped, max_n_padded, max_row_blocks, dense,
                                                                    stream);
  return true;
}

// The pairs compiled together: both products of fixed walks, the dense one of as many phases as
// the grouped one or twice as many (V2's and V2-Lite's routed and shared down products, K 1,408
// and 2,816, and V3's, K 2,048 both, in either weight type), both of bf16 rows or both of fp32
// rows (kXF32). Returns false where the pair is not among them.
template <bool kFp8, bool kXF32>
bool launch_paired_forms(const GroupedGemmArgs& grouped, int max_n_padded, int max_row_blocks,
                         const GroupedGemmArgs& dense, Stream stream) {
  const int g = one_row_fixed_phases(grouped), d = one_row_fixed_phases(dense);
  return launch_if_phases<kFp8, kXF32, 1, 1>(g, d, grouped, max_n_padded, max_row_blocks, dense, stream) ||
         launch_if_phases<kFp8, kXF32, 1, 2>(g, d, grouped, max_n_padded, max_row_blocks, dense, stream) ||
         launch_if_phases<kFp8, kXF32, 2, 2>(g, d, grouped, max_n_padded, max_row_blocks, dense, stream) ||
         launch_if_phases<kFp8, kXF32, 2, 4>(g, d, grouped, max_n_padded, max_row_blocks, dense, stream);
}

}  // namespace

void launch_few_row_gemm_with_dense(const GroupedGemmArgs& grouped, int max_n_padded, int max_row_blocks,
                                    const GroupedGemmArgs& dense, Stream stream) {
  DS_CHECK(grouped.groups != nullptr && dense.groups == nullptr && dense.k_splits == 1 && dense.ldx % 8 == 0 &&
           dense.dense.n_padded % kGemmTileRows == 0 && dense.dense_rows == 1 &&
           dense.residual_norm.x == nullptr);
  if (max_n_padded == 0 || max_row_blocks <= 0) {
    launch_few_row_gemm(dense, dense.dense.n_padded, 1, 1, stream);
    return;
  }
  DS_CHECK(max_n_padded % kGemmTileRows == 0 && grouped.ldx % 8 == 0 && grouped.k_splits == 1);
  few_row::check_f32_rows(grouped, 1);
  few_row::check_f32_rows(dense, 1);
  const bool f32_rows = grouped.x_f32 != nullptr;
  const auto paired_forms_of = [&](auto fp8) {
    constexpr bool kFp8 = decltype(fp8)::value;
    return f32_rows ? launch_paired_forms<kFp8, true>(grouped, max_n_padded, max_row_blocks, dense, stream)
                    : launch_paired_forms<kFp8, false>(grouped, max_n_padded, max_row_blocks, dense, stream);
  };
  const bool paired = grouped.weights_fp8 == dense.weights_fp8 && f32_rows == (dense.x_f32 != nullptr) &&
                      (grouped.weights_fp8 ? paired_forms_of(std::true_type{}) : paired_forms_of(std::false_type{}));
  if (paired) return;
  launch_few_row_gemm(grouped, max_n_padded, max_row_blocks, 1, stream);
  launch_few_row_gemm(dense, dense.dense.n_padded, 1, 1, stream);
}

}  // namespace dsinfer::cuda
