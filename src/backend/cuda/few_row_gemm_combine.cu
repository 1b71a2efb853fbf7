// A one-token step's routed down product whose blocks also do the MoE combine: the last of a
// column slice's blocks to finish (one a row-block, that is a routed expert) adds the slice's
// routed rows and the shared experts' row to the residual and writes the norm's output before its
// 1 / rms, as the combine kernel does (moe_combine.cuh, the same bits).
//
// Why: the combine was a launch of two blocks after the down product, some 2 µs of a batch-1
// layer on an H100 for 8 KB of arithmetic, and the next layer's first launch (q_proj and kv_a)
// could place its blocks, which request their weights before their wait, only after the down
// product had left the GPU and the combine had begun. Here that launch follows the down product
// directly, its blocks taking the SMs the down product's blocks leave. Kernel timeline on an H100
// (V2-Lite, 1k contexts): the FP8 layer 68.1 → 67.1 µs, bf16 85.0 → 84.2; q_proj and kv_a's
// launch 8.2 → 6.4 µs (bf16 9.5 → 5.6), this one 6.9 → 10.2 (10.2 → 15.9) with the combine's
// arrivals and reads; batch-1 decode 0.4–0.6% faster (bench/RESULTS.md).
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/few_row_form.cuh"
#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/moe_combine.cuh"

namespace dsinfer::cuda {
namespace {

struct CombineJob {
  MoeCombineRows rows;
  ResidualNormOutput out;
  int64_t hidden = 0;
  int32_t* arrivals = nullptr;  // [grid x], zero before and after the launch
};

// Block (x, y): the product's block of units [x · units_per_block, …) of row-block y, then its
// arrival at slice x's count; the slice's last block combines the slice's columns.
template <typename Form>
__global__ void __launch_bounds__(few_row::kThreads, Form::kMinBlocksPerSm)
    few_row_gemm_combine_kernel(GroupedGemmArgs a, int units_per_block, CombineJob job) {
  Form::run(a, units_per_block, blockIdx.x, blockIdx.y);
  // The block's arrival: after the barrier, one release-acquire add at GPU scope carries every
  // thread's product stores to the slice's other blocks (release), and gives the last of them
  // theirs (acquire); the barrier after it passes those on to the block's other threads.
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    int before;
    asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;"
                 : "=r"(before)
                 : "l"(job.arrivals + blockIdx.x)
                 : "memory");
    last = before + 1 == static_cast<int>(gridDim.y);
    if (last) job.arrivals[blockIdx.x] = 0;  // for the next launch, which starts after this one ends
  }
  __syncthreads();
  if (!last) return;
  const int64_t first_col = int64_t{blockIdx.x} * units_per_block * Form::kUnitRows;
  const int64_t slice_end = first_col + int64_t{units_per_block} * Form::kUnitRows;
  const int64_t end_col = slice_end < job.hidden ? slice_end : job.hidden;
  for (int64_t c = first_col + 4 * threadIdx.x; c < end_col; c += 4 * few_row::kThreads)
    moe::combine_columns<float, 4>(static_cast<const float*>(job.rows.expert_out), job.rows.ld_expert,
                                   job.rows.slot_row, job.rows.weights, job.rows.shared, 0, job.rows.top_k,
                                   job.hidden, c, nullptr, job.out, job.rows.slots_at_once);
}

}  // namespace

void launch_few_row_gemm_combine(const GroupedGemmArgs& a, int max_n_padded, int max_row_blocks,
                                 const MoeCombineRows& rows, int64_t hidden, const ResidualNormOutput& out,
                                 int32_t* arrivals, int max_arrivals, Stream stream) {
  DS_CHECK(a.groups != nullptr && a.k_splits == 1 && a.ldx % 8 == 0 && max_n_padded % kGemmTileRows == 0 &&
           max_n_padded >= hidden && max_row_blocks >= 1 && max_row_blocks <= 65535 && !rows.expert_out_bf16 &&
           rows.expert_out == a.y && rows.ld_expert == a.ldy && a.epilogue == GemmEpilogue::kStoreF32 &&
           out.x != nullptr && out.w != nullptr && out.out != nullptr && out.out_bf16 != nullptr &&
           out.partials != nullptr && hidden % 128 == 0 && moe_combine_rows_in_fours(rows, hidden));
  CombineJob job{rows, out, hidden, arrivals};
  job.rows.slots_at_once = std::clamp(rows.slots_at_once, 1, kMoeCombineSlotsAtOnce);
  few_row::with_block_form(a, 1, [&](auto form) {
    using Form = decltype(form);
    constexpr auto kernel = few_row_gemm_combine_kernel<Form>;
    // Sized as launch_few_row_gemm sizes its one wave of blocks.
    const few_row::OneWave wave = few_row::one_wave<Form, kernel>(a, max_n_padded, max_row_blocks);
    DS_CHECK_MSG(static_cast<int>(wave.grid.x) <= max_arrivals,
                 "the combine's arrival counts: " << wave.grid.x << " slices");
    launch_kernel(kernel, wave.grid, few_row::kThreads, wave.shared_bytes, stream, a, wave.units_per_block, job);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dsinfer::cuda
