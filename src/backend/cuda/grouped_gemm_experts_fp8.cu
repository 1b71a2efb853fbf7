// The 128-row expert blocks for e4m3 experts (grouped_gemm.h, `expert_blocks`): weight-only
// FP8 routed experts of a decode-sized MoE layer with a few rows per expert or more.
//
// The blocks are those of grouped_gemm_experts.cu (a block owns 128 weight rows of one expert, a
// warp 32 of them; the four warps share one cp.async pipeline), but a stage carries 128 columns:
// 16 KB of e4m3 weight, the same bytes as a bf16 stage of 64 columns, so that as many bytes are in
// flight per SM. The weights are widened in registers, not in shared memory (mma_e4m3_step in
// grouped_gemm.cuh):
// - A lane's fragment of a 16-column tensor-core step takes four consecutive columns of a weight
//   row and the same four of an x row. The step's columns are a permutation of 16 columns, the
//   same for both operands, so the sums are those of the product.
// - A word of four e4m3 becomes two bf16 pairs with shifts and masks: the bits of e4m3 value v in
//   bf16's fields are v · 2⁻¹²⁰ exactly (subnormals included), and one bf16 multiply by 2¹²⁰ gives
//   v. Every e4m3 value is a bf16 value, so the weights enter the sums unrounded.
// - A stage is one block of the weight's scales along k: the warp's sums of a stage are multiplied
//   by the scale of their 16 weight rows in fp32 and added to its totals.
//
// An output is summed over k in one fixed order whatever the number of rows, but in another
// order than the 32-row blocks' (which batch-invariant steps keep).
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/tensor_core.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
static_assert(kWarps * kGemmTileRows == kExpertBlockWeightRows, "a warp per 32 weight rows");
constexpr int kStageK = kScaleCols;                        // columns per stage: one scale block
constexpr int kStages = 4;
// A stage's weight rows: 128 bytes each, unpadded. The 16-byte piece p of row r lies at piece
// p ^ 4 (r & 1): the eight lanes of a 16-byte load read two rows' halves, one of each parity.
constexpr int kWeightPiecesPerRow = kStageK / 16;
constexpr int kWeightStageBytes = kExpertBlockWeightRows * kStageK;
// bf16 per shared-memory x row of a stage: 128 + 8 of padding (272 bytes), so that the two rows
// of a 16-byte load's eight lanes fall in different banks.
constexpr int kXLd = kStageK + 8;
constexpr int kXPiecesPerRow = kStageK * 2 / 16;

template <int kFrags>
struct Layout {
  static constexpr int kRows = 8 * kFrags;  // routed rows per pass
  static constexpr int kStageBytes = kWeightStageBytes + kRows * kXLd * 2;
  static constexpr int kBytes = kStages * kStageBytes;
  // The finished tiles, [warp][kRows][32] fp32, reuse the stages.
  static_assert(kWarps * kRows * kGemmTileRows * 4 <= kBytes, "the epilogue reuses the pipeline's memory");
  static_assert(kStageBytes % 16 == 0, "16-byte pieces");
  static_assert(2 * (kBytes + 1024) <= 227 * 1024, "two blocks fit on an SM");
};

__device__ __forceinline__ int weight_piece_offset(int row, int piece) {
  return (row * kWeightPiecesPerRow + (piece ^ ((row & 1) << 2))) * 16;
}

__device__ __forceinline__ uint4 load_shared16(const void* p) { return *static_cast<const uint4*>(p); }

template <int kFrags>
__global__ void __launch_bounds__(kThreads, 2) expert_gemm_fp8_kernel(GroupedGemmArgs a) {
  await_previous_kernels();
  using L = Layout<kFrags>;
  constexpr int kRows = L::kRows;
  extern __shared__ __align__(128) unsigned char smem[];

  ExpertBlock b;  // this block's expert, rows and weight rows
  if (!b.locate(a)) return;
  const GemmWeight& w = b.w;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int k_padded = w.k_padded;
  const int num_stages = (k_padded + kStageK - 1) / kStageK;  // = the scale columns
  const uint8_t* wq = static_cast<const uint8_t*>(w.data);
  // The scales of this warp's two 16-row groups, one per stage.
  const float* scales0 = w.scales + static_cast<int64_t>(b.n0 / 16) * num_stages;
  const float* scales1 = scales0 + num_stages;

  for (int pass_begin = b.row_begin; pass_begin < b.row_end; pass_begin += kRows) {
    const int pass_rows = min(kRows, b.row_end - pass_begin);
    using XPieces = ExpertPassPieces<kThreads, kRows, kXPiecesPerRow>;
    const XPieces x(reinterpret_cast<const __nv_bfloat16*>(a.x), a, pass_begin, pass_rows);

    // Stage s holds columns [128 s, 128 s + 128); columns at or past k_padded (a multiple of 32)
    // are zero-filled in both operands.
    auto issue = [&](int s) {
      unsigned char* stage = smem + (s % kStages) * L::kStageBytes;
      const int k0 = s * kStageK, num_k = min(kStageK, k_padded - k0);
#pragma unroll
      for (int c = threadIdx.x; c < kExpertBlockWeightRows * kWeightPiecesPerRow; c += kThreads) {
        const int r = c / kWeightPiecesPerRow, piece = c % kWeightPiecesPerRow;
        if (r >= b.weight_rows) continue;
        const uint8_t* row = wq + static_cast<int64_t>(b.n_block + r) * k_padded;
        const bool valid = piece * 16 < num_k;
        cp_async16(stage + weight_piece_offset(r, piece), valid ? row + k0 + piece * 16 : row, valid);
      }
      unsigned char* x_tile = stage + kWeightStageBytes;
#pragma unroll
      for (int j = 0; j < XPieces::kPerThread; ++j) {
        const int p = threadIdx.x + j * kThreads, r = p / kXPiecesPerRow, piece = p % kXPiecesPerRow;
        if (p >= XPieces::kPieces) continue;
        const bool valid = x.valid[j] && piece * 8 < num_k;
        cp_async16(x_tile + (r * kXLd + piece * 8) * 2, valid ? x.src[j] + k0 : x.src[j] - piece * 8, valid);
      }
    };

    // acc[m][f]: weight rows n0 + 16 m + (g, g + 8) × x rows 8 f + (2t, 2t + 1) (mma's C layout).
    float acc[2][kFrags][4] = {};
    start_cp_async_pipeline<kStages>(issue, num_stages);
    for (int s = 0; s < num_stages; ++s) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // stage s is in place; every warp is done with stage s - 1, which is refilled now
      if (s + kStages - 1 < num_stages) issue(s + kStages - 1);
      cp_async_commit();
      if (!b.has_tile) continue;
      const float scale0 = __ldg(scales0 + s), scale1 = __ldg(scales1 + s);
      const unsigned char* stage = smem + (s % kStages) * L::kStageBytes;
      const __nv_bfloat16* x_tile = reinterpret_cast<const __nv_bfloat16*>(stage + kWeightStageBytes);
      float part[2][kFrags][4] = {};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Lane (g, t) takes columns 64 h + 16 t .. + 15: four per step j (mma_e4m3_step).
        uint32_t x_even[4][kFrags], x_odd[4][kFrags];
#pragma unroll
        for (int f = 0; f < kFrags; ++f) {
          const __nv_bfloat16* x_row = x_tile + (f * 8 + g) * kXLd + 64 * h + 16 * t;
          const uint4 lo = load_shared16(x_row), hi = load_shared16(x_row + 8);
          pair_x_words(lo.x, lo.y, x_even[0][f], x_odd[0][f]);
          pair_x_words(lo.z, lo.w, x_even[1][f], x_odd[1][f]);
          pair_x_words(hi.x, hi.y, x_even[2][f], x_odd[2][f]);
          pair_x_words(hi.z, hi.w, x_even[3][f], x_odd[3][f]);
        }
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const int r = warp * kGemmTileRows + 16 * m + g;
          const uint4 w_lo = load_shared16(stage + weight_piece_offset(r, 4 * h + t));
          const uint4 w_hi = load_shared16(stage + weight_piece_offset(r + 8, 4 * h + t));
          mma_e4m3_step<kFrags>(part[m], w_lo.x, w_hi.x, x_even[0], x_odd[0]);
          mma_e4m3_step<kFrags>(part[m], w_lo.y, w_hi.y, x_even[1], x_odd[1]);
          mma_e4m3_step<kFrags>(part[m], w_lo.z, w_hi.z, x_even[2], x_odd[2]);
          mma_e4m3_step<kFrags>(part[m], w_lo.w, w_hi.w, x_even[3], x_odd[3]);
        }
      }
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[0][f][i] += part[0][f][i] * scale0;
          acc[1][f][i] += part[1][f][i] * scale1;
        }
    }

    // The warp's finished tile, [kRows routed rows][32 weight rows], then the epilogue.
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages
    float* tile = reinterpret_cast<float*>(smem) + warp * kRows * kGemmTileRows;
    if (b.has_tile) {
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int f = 0; f < kFrags; ++f) {
          float* col = tile + (8 * f + 2 * t) * kGemmTileRows + 16 * m + g;
          col[0] = acc[m][f][0];
          col[kGemmTileRows] = acc[m][f][1];
          col[8] = acc[m][f][2];
          col[kGemmTileRows + 8] = acc[m][f][3];
        }
      __syncwarp();
      store_expert_tile(a, tile, b.n0, pass_begin, pass_rows);
    }
    __syncthreads();  // the tiles' memory is the next pass's pipeline
  }
}

template <int kFrags>
void launch_with(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, Stream stream) {
  launch_expert_blocks<expert_gemm_fp8_kernel<kFrags>>(args, max_n_padded, max_row_blocks, kThreads,
                                                       Layout<kFrags>::kBytes, stream);
}

}  // namespace

void launch_expert_gemm_fp8(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, int rows_hint,
                            Stream stream) {
  DS_CHECK(args.groups != nullptr && args.k_splits == 1 && args.weights_fp8);
  // Rows per pass from the typical rows per expert (never the result). Passes of 32 rows at most:
  // each pass's sums take two register sets (the stage's and the totals), and experts with more
  // rows than a pass re-read their weights.
  if (rows_hint <= 12) launch_with<2>(args, max_n_padded, max_row_blocks, stream);
  else launch_with<4>(args, max_n_padded, max_row_blocks, stream);
}

}  // namespace dsinfer::cuda
