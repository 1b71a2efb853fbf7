// The grouped GEMM's 128-row expert blocks (grouped_gemm.h, `expert_blocks`): the bf16 routed
// experts of a decode-sized MoE layer with a few rows per expert or more.
//
// A thread block owns 128 weight rows of one expert (four 32-row tiles, one per warp) and one
// row-block of that expert's routed rows. The four warps share every x chunk, and weights and
// rows stream through one block-wide cp.async pipeline of 64-column stages: 16 KB of bf16
// weight per stage, three stages in flight, two blocks per SM, so that about 100 KB per SM is
// on its way from memory at any time. That is what a product bound by weight bandwidth needs;
// the 32-row blocks (a pipeline per warp) keep a third of it in flight and re-read x for
// every 32 weight rows. At batch 256 on V2-Lite the gate/up product reads 754 MB in 243 µs,
// 73% of the copy rate.
//
// Each warp walks the whole K of its tile in order, 16 columns per tensor-core step, so an
// output is summed over k in one fixed order, whatever the number of rows: greedy decoding
// stays batch-invariant, and no sum across warps is needed.
#include <cuda_bf16.h>
#include <mma.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/tensor_core.cuh"

namespace dsinfer::cuda {
namespace {

using namespace nvcuda;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
static_assert(kWarps * kGemmTileRows == kExpertBlockWeightRows, "a warp per 32 weight rows");
constexpr int kStageK = 2 * kGemmChunkK;                  // columns per pipeline stage
constexpr int kStages = 4;
// bf16 per shared-memory row of a stage: 64 + 8 of padding (144 bytes), so that the eight rows
// of a fragment load start in different bank groups while each stays 32-byte aligned.
constexpr int kLd = kStageK + 8;
constexpr int kPiecesPerRow = kStageK * 2 / 16;  // 16-byte copies per bf16 row of a stage

template <int kFrags>
struct Layout {
  static constexpr int kRows = 8 * kFrags;  // routed rows per pass
  // A stage: the block's weight rows, then the pass's x rows.
  static constexpr int kWeightBytes = kExpertBlockWeightRows * kLd * 2;
  static constexpr int kXBytes = kRows * kLd * 2;
  static constexpr int kStageBytes = kWeightBytes + kXBytes;
  static constexpr int kBytes = kStages * kStageBytes;
  // The finished tiles, [warp][kRows][32] fp32, reuse the stages.
  static constexpr int kEpilogueBytes = kWarps * kRows * kGemmTileRows * 4;
  static_assert(kEpilogueBytes <= kBytes, "the epilogue reuses the pipeline's memory");
  static_assert(kStageBytes % 32 == 0 && kWeightBytes % 32 == 0, "fragments need 32-byte alignment");
  static_assert(2 * (kBytes + 1024) <= 227 * 1024, "two blocks fit on an SM");
};

template <int kFrags>
__global__ void __launch_bounds__(kThreads, 2) expert_gemm_kernel(GroupedGemmArgs a) {
  await_previous_kernels();
  using L = Layout<kFrags>;
  constexpr int kRows = L::kRows;
  extern __shared__ __align__(128) unsigned char smem[];

  ExpertBlock b;  // this block's expert, rows and weight rows
  if (!b.locate(a)) return;
  const GemmWeight& w = b.w;
  const int warp = threadIdx.x / 32;
  const int k_padded = w.k_padded;
  const int num_stages = (k_padded + kStageK - 1) / kStageK;

  for (int pass_begin = b.row_begin; pass_begin < b.row_end; pass_begin += kRows) {
    const int pass_rows = min(kRows, b.row_end - pass_begin);
    using XPieces = ExpertPassPieces<kThreads, kRows, kPiecesPerRow>;
    const XPieces x(reinterpret_cast<const __nv_bfloat16*>(a.x), a, pass_begin, pass_rows);

    // Stage s holds columns [64 s, 64 s + 64) of the weight rows and of the pass's x rows; a
    // last stage of 32 columns (k_padded a multiple of 32 only) copies just its first half.
    auto issue = [&](int s) {
      unsigned char* stage = smem + (s % kStages) * L::kStageBytes;
      const int k0 = s * kStageK;
      const int num_pieces = min(kStageK, k_padded - k0) * 2 / 16;  // per bf16 row
      const __nv_bfloat16* wb = static_cast<const __nv_bfloat16*>(w.data);
#pragma unroll
      for (int c = threadIdx.x; c < kExpertBlockWeightRows * kPiecesPerRow; c += kThreads) {
        const int r = c / kPiecesPerRow, part = c % kPiecesPerRow;
        if (r < b.weight_rows && part < num_pieces) {
          const __nv_bfloat16* src = wb + static_cast<int64_t>(b.n_block + r) * k_padded + k0 + part * 8;
          cp_async16(stage + (r * kLd + part * 8) * 2, src, true);
        }
      }
      unsigned char* x_tile = stage + L::kWeightBytes;
#pragma unroll
      for (int j = 0; j < XPieces::kPerThread; ++j) {
        const int p = threadIdx.x + j * kThreads, t = p / kPiecesPerRow, part = p % kPiecesPerRow;
        if (p < XPieces::kPieces && part < num_pieces)
          cp_async16(x_tile + (t * kLd + part * 8) * 2, x.src[j] + k0, x.valid[j]);
      }
    };

    WeightRowsAccumulators<kFrags> acc;
#pragma unroll
    for (int f = 0; f < kFrags; ++f) wmma::fill_fragment(acc[f], 0.0f);

    start_cp_async_pipeline<kStages>(issue, num_stages);
    for (int s = 0; s < num_stages; ++s) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // stage s is in place; every warp is done with stage s - 1, which is refilled now
      if (s + kStages - 1 < num_stages) issue(s + kStages - 1);
      cp_async_commit();
      if (!b.has_tile) continue;
      const unsigned char* stage = smem + (s % kStages) * L::kStageBytes;
      const int k0 = s * kStageK, num_k = min(kStageK, k_padded - k0);
      const __nv_bfloat16* w_tile = reinterpret_cast<const __nv_bfloat16*>(stage) + warp * kGemmTileRows * kLd;
      const __nv_bfloat16* x_tile = reinterpret_cast<const __nv_bfloat16*>(stage + L::kWeightBytes);
#pragma unroll
      for (int kk = 0; kk < kStageK; kk += 16) {
        if (kk >= num_k) break;
        mma_k16_step<kFrags>(acc, w_tile + kk, x_tile + kk, kLd);
      }
    }

    // The warp's finished tile, [kRows routed rows][32 weight rows] (column-major store, so
    // that a lane per weight row reads consecutive words), then the epilogue.
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages
    float* tile = reinterpret_cast<float*>(smem) + warp * kRows * kGemmTileRows;
    if (b.has_tile) {
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
        wmma::store_matrix_sync(tile + f * 8 * kGemmTileRows, acc[f], kGemmTileRows, wmma::mem_col_major);
      __syncwarp();
      store_expert_tile(a, tile, b.n0, pass_begin, pass_rows);
    }
    __syncthreads();  // the tiles' memory is the next pass's pipeline
  }
}

template <int kFrags>
void launch_with(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, Stream stream) {
  launch_expert_blocks<expert_gemm_kernel<kFrags>>(args, max_n_padded, max_row_blocks, kThreads,
                                                   Layout<kFrags>::kBytes, stream);
}

}  // namespace

void launch_expert_gemm(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, int rows_hint,
                        Stream stream) {
  DS_CHECK(args.groups != nullptr && args.k_splits == 1 && !args.weights_fp8);
  // Rows per pass from the typical rows per expert (it never changes the result). Rows past an
  // expert's own cost tensor-core products and shared memory for nothing, while an expert with
  // more rows than a pass re-reads its weights: at 24 rows per expert on average, passes of 32
  // rows (a few experts taking two) ran the gate/up product in 243 µs, passes of 64 in 290.
  if (rows_hint <= 12) launch_with<2>(args, max_n_padded, max_row_blocks, stream);
  else if (rows_hint <= 28) launch_with<4>(args, max_n_padded, max_row_blocks, stream);
  else launch_with<8>(args, max_n_padded, max_row_blocks, stream);
}

}  // namespace dsinfer::cuda
