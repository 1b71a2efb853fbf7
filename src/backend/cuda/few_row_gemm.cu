// Products of a few rows (decode at batch 1 to 4): y = x · Wᵀ on CUDA cores, each weight read
// once, straight into registers (see grouped_gemm.h for the arguments).
//
// Why not the tensor-core kernel (grouped_gemm.cu): at one to four rows a product is a pure
// weight read, and what counts is how soon the bytes are requested and how little happens after
// the last one arrives. The tensor-core kernel stages 32x32 chunks through shared memory and
// splits K over blocks whose partial tiles a last block adds after a fence and a counter: a chain
// of memory round trips behind the weight read. Here a block takes whole weight rows, four at a
// time (a quad), over their whole K: each thread keeps several 16-byte pieces of them in flight
// in registers (for a dense weight, from before the kernel waits for the ones before it),
// multiplies each with the matching x pieces as it arrives, and the block adds its threads' sums
// through warp shuffles and shared memory. No partial sum leaves the block, and the order of an
// output's sums depends on K alone. e4m3 weights may take a tensor-core form of the same blocks
// instead (few_row_mma.cuh, GroupedGemmArgs::few_row_mma; few_row_form.cuh picks and sizes).
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/few_row_form.cuh"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/moe_routing.cuh"

namespace dsinfer::cuda {
namespace {

template <typename Form>
__global__ void __launch_bounds__(few_row::kThreads, Form::kMinBlocksPerSm)
    few_row_gemm_kernel(GroupedGemmArgs a, int units_per_block) {
  Form::run(a, units_per_block, blockIdx.x, blockIdx.y);
}

template <typename Form>
void launch_with(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, Stream stream) {
  constexpr auto kernel = few_row_gemm_kernel<Form>;
  // One wave of resident blocks (few_row::units_per_block). Even the LM head (25,600 quads)
  // keeps one wave: in blocks of one quad it took 97.5 µs instead of 112.6 under Nsight
  // Compute, yet recorded steps were 2% slower at batch 1 and 2.
  const few_row::OneWave wave = few_row::one_wave<Form, kernel>(args, max_n_padded, max_row_blocks);
  launch_kernel(kernel, wave.grid, few_row::kThreads, wave.shared_bytes, stream, args, wave.units_per_block);
  DS_CUDA_CHECK_LAUNCH();
}

// Blocks [0, logit_blocks): the router logits job's (none without one); then product a's
// blocks_a; the rest: b's.
template <typename Form>
__global__ void __launch_bounds__(few_row::kThreads, Form::kMinBlocksPerSm)
    few_row_gemm_pair_kernel(GroupedGemmArgs a, GroupedGemmArgs b, int units_per_block, int blocks_a,
                             moe::RouterLogitsJob logits, int logit_blocks) {
  const int x = static_cast<int>(blockIdx.x) - logit_blocks;
  if (x < 0) moe::router_logits_block(logits, 0, x + logit_blocks);
  else if (x < blocks_a) Form::run(a, units_per_block, x, 0);
  else Form::run(b, units_per_block, x - blocks_a, 0);
}

}  // namespace

void launch_few_row_gemm_pair(const GroupedGemmArgs& a, const GroupedGemmArgs& b, int rows, Stream stream,
                              const RouterLogitsRow* logits_row) {
  const moe::RouterLogitsJob logits =
      logits_row != nullptr ? moe::one_token_job(*logits_row) : moe::RouterLogitsJob{};
  const int logit_blocks = logits_row != nullptr ? logits.expert_blocks() : 0;  // one token's
  DS_CHECK(a.groups == nullptr && b.groups == nullptr && a.k_splits == 1 && b.k_splits == 1 && a.ldx % 8 == 0 &&
           b.ldx % 8 == 0 && a.dense_rows == rows && b.dense_rows == rows && a.weights_fp8 == b.weights_fp8 &&
           a.few_row_mma == b.few_row_mma && a.few_row_fixed_phases == b.few_row_fixed_phases &&
           (a.x_f32 == nullptr) == (b.x_f32 == nullptr) &&
           a.dense.n_padded % kGemmTileRows == 0 &&
           b.dense.n_padded % kGemmTileRows == 0 && rows >= 1 && rows <= kFewRowGemmMaxRows);
  few_row::check_f32_rows(a, rows);
  few_row::check_f32_rows(b, rows);
  // One form for both: the one that rows of the wider K take. Fixed walks of up to two phases:
  // the pair's one-row bf16 form of four spills.
  const GroupedGemmArgs& wider = a.ldx >= b.ldx ? a : b;
  few_row::with_block_form</*kMaxFixedPhases=*/2>(wider, rows, [&](auto form) {
    using Form = decltype(form);
    constexpr auto kernel = few_row_gemm_pair_kernel<Form>;
    const size_t shared_bytes = std::max(Form::shared_bytes(a), Form::shared_bytes(b));
    Form::template allow_shared_memory<kernel>();
    // One wave over both weights' units and the logits' blocks, as launch_with sizes one.
    const int units_a = a.dense.n_padded / Form::kUnitRows, units_b = b.dense.n_padded / Form::kUnitRows;
    const int64_t capacity = std::max(1, few_row::resident_blocks<kernel>(shared_bytes) - logit_blocks);
    const int units_per_block = few_row::units_per_block(units_a + units_b, 1, capacity, Form::kMaxUnitsPerBlock);
    const int blocks_a = (units_a + units_per_block - 1) / units_per_block;
    const int blocks_b = (units_b + units_per_block - 1) / units_per_block;
    launch_kernel(kernel, logit_blocks + blocks_a + blocks_b, few_row::kThreads, shared_bytes, stream, a, b,
                  units_per_block, blocks_a, logits, logit_blocks);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void launch_few_row_gemm(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, int max_rows_per_block,
                         Stream stream) {
  DS_CHECK(max_n_padded % kGemmTileRows == 0 && args.ldx % 8 == 0 && args.k_splits == 1);
  if (max_n_padded == 0 || max_row_blocks <= 0) return;
  DS_CHECK_MSG(max_row_blocks <= 65535, "few-row GEMM: " << max_row_blocks << " row blocks is beyond the grid");
  few_row::with_block_form(args, max_rows_per_block, [&](auto form) {
    launch_with<decltype(form)>(args, max_n_padded, max_row_blocks, stream);
  });
}

}  // namespace dsinfer::cuda
