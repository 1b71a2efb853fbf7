// The 128-row expert blocks for e4m3 experts with e4m3 activations (grouped_gemm.h, `xq`):
// DeepSeek's FP8 recipe for the routed experts of a decode-sized MoE layer, on Hopper's FP8
// warpgroup products (wgmma.cuh).
//
// A block is one warpgroup and owns 128 weight rows of one expert and one row-block of its routed
// rows (ExpertBlock), as in grouped_gemm_experts_fp8.cu; what differs is the arithmetic. That
// kernel widens each e4m3 weight to bf16 in registers and runs bf16 mma.sync, about a dozen
// instructions per four weights; here the tensor cores read both operands as stored:
// - a stage is 128 columns of k (one scale block of the weight and of the activations): the
//   weight's 128 rows × 128 bytes, the pass's x rows × 128 bytes (e4m3, quantised per row and 128
//   columns by launch_quantize_rows_e4m3) and their scales, all through one cp.async pipeline
//   into the 128-byte swizzle the products read;
// - per stage, two m64 products (the block's two 64-row halves; weight rows past the weight are
//   zeros) of four 32-byte k-steps each. Their sums, exact products of e4m3 values added in
//   fp32, are multiplied by the weight block's scale and each x row's scale and added to the
//   totals in registers.
// Rows per pass are 32 or 64 (a row-block holds up to 64 routed rows): with 64 an expert's weight
// is read once per row-block whatever its rows.
//
// Activations in e4m3 terms (a.x_terms, launch_quantize_rows_e4m3_terms): a stage holds every
// term's x rows and scales, so the weight is read once for all of them. The terms' rows lie side
// by side in one operand of terms × rows (stacked_row: each 8 rows of a term next to the same 8
// rows of the others), so one product per half and k-step takes them all, and a thread holds
// every term's sum of the same x rows: it scales each by its term's x scale and adds them to the
// totals. Such passes are of 32 rows (n = 96 for three terms; 181 registers). Separate products
// per term, each awaited before its scaling, took 252 registers and streamed a prompt step's
// weights at 67% of the copy rate, side by side 76%, one term 90% (H100). Waiting on the products
// and on issuing the scaling's instructions is what holds them there (RESULTS.md, "Expert terms
// side by side"); a row's terms summed before the weight's scale, 3.7% fewer instructions, took
// as long (RESULTS.md, "Last round's code checked on an H100"). Passes of 16 rows (n = 48)
// prefilled a 128-token prompt about 5% slower on an H200, its experts' 12 rows or so on average
// notwithstanding (most likely since those past 16 rows read their weights twice).
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/kernel_launch.cuh"
#include "backend/cuda/tensor_core.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kWarps = 4;  // one warpgroup
constexpr int kThreads = kWarps * 32;
static_assert(kWarps * kGemmTileRows == kExpertBlockWeightRows, "a warp's epilogue per 32 weight rows");
constexpr int kStageK = kScaleCols;  // columns per stage: one scale block, one 128-byte swizzle row
constexpr int kHalfRows = 64;        // weight rows of one m64 product
// Passes of 32 rows up to this many rows per expert on average: at 24 (batch 256 on V2-Lite),
// passes of 32 decoded 1% faster than passes of 64, though the few experts with more than 32
// rows read their weights twice.
constexpr int kPassRows32MaxHint = 24;
constexpr int kPiecesPerRow = kStageK / 16;

template <int kRows, int kTerms>
struct Layout {
  static_assert(kRows % 8 == 0, "whole 8-row groups of each term");
  static constexpr int kN = kTerms * kRows;  // the x operand's rows: every term's
  static constexpr int kWeightBytes = kExpertBlockWeightRows * kStageK;
  static constexpr int kXOffset = kWeightBytes;  // a multiple of 1024, as the products need
  static constexpr int kScaleOffset = kXOffset + kN * kStageK;
  static constexpr int kStageBytes = (kScaleOffset + kTerms * kRows * 4 + 1023) / 1024 * 1024;
  // Stages in flight: as many as two blocks per SM fit, five at most (one term: 5 for passes of 32
  // rows, 4 for 64; three terms of 32 rows: 3).
  static constexpr int kStagesThatFit = (113 * 1024 - 2048) / kStageBytes;
  static constexpr int kStages = kStagesThatFit < 5 ? kStagesThatFit : 5;
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  static constexpr int kBytes = kPipelineBytes + 1024;  // and the slack to align the start to 1024
  // The finished tiles, [warp][kRows][32] fp32, reuse the stages.
  static_assert(kWarps * kRows * kGemmTileRows * 4 <= kPipelineBytes, "the epilogue reuses the pipeline's memory");
  static_assert(2 * (kBytes + 1024) <= 227 * 1024, "two blocks fit on an SM");
  static_assert(kRows * kPiecesPerRow % kThreads == 0 && kRows <= kThreads, "whole x pieces per thread");
  static_assert(kStages >= 3, "three stages in flight at least");
  // The operand row of row r of term `term`: 8-row group kTerms (r / 8) + term.
  static __device__ __forceinline__ int stacked_row(int r, int term) {
    if constexpr (kTerms == 1) return r;
    else return 8 * (kTerms * (r / 8) + term) + r % 8;
  }
};

template <int kRows, int kTerms>
__global__ void __launch_bounds__(kThreads, 2) expert_gemm_wgmma_kernel(GroupedGemmArgs a) {
  await_previous_kernels();
  using L = Layout<kRows, kTerms>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  const uint32_t smem_addr = shared_address(smem);

  ExpertBlock b;  // this block's expert, rows and weight rows
  if (!b.locate(a)) return;
  const GemmWeight& w = b.w;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int num_stages = w.k_padded / kStageK;
  const uint8_t* wq = static_cast<const uint8_t*>(w.data);
  // The scales of this thread's rows in each half: rows 64 h + 16 warp + (g, g + 8), one 16-row
  // scale group; none for rows past the weight.
  const float* w_scales[2];
  bool w_scale_valid[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = b.n_block + h * kHalfRows + 16 * warp;
    w_scale_valid[h] = row < w.n_padded;
    w_scales[h] = w.scales + static_cast<int64_t>(w_scale_valid[h] ? row / 16 : 0) * num_stages;
  }
  // A thread copies 16-byte piece threadIdx.x % 8 of rows threadIdx.x / 8 + 16 j.
  const int piece = threadIdx.x % kPiecesPerRow, row0 = threadIdx.x / kPiecesPerRow;
  constexpr int kRowStep = kThreads / kPiecesPerRow;

  for (int pass_begin = b.row_begin; pass_begin < b.row_end; pass_begin += kRows) {
    const int pass_rows = min(kRows, b.row_end - pass_begin);
    // Piece j of this thread is row row0 + kRowStep j of the pass, at piece `piece`.
    using XPieces = ExpertPassPieces<kThreads, kRows, kPiecesPerRow, uint8_t>;
    const XPieces x(a.xq, a, pass_begin, pass_rows);
    // Thread r < kRows copies the scales of x row r.
    const bool scale_valid = static_cast<int>(threadIdx.x) < pass_rows;
    const int64_t scale_row =
        !scale_valid ? 0 : a.src_rows != nullptr ? a.src_rows[pass_begin + threadIdx.x] : pass_begin + threadIdx.x;
    const float* scale_src = a.x_scales + scale_row;
    // Term t's rows and scales lie x_term_rows rows further on in global memory.
    const int64_t term_bytes = a.x_term_rows * a.ldx;

    auto issue = [&](int s) {
      unsigned char* stage = smem + (s % L::kStages) * L::kStageBytes;
      const int64_t k0 = static_cast<int64_t>(s) * kStageK;
#pragma unroll
      for (int j = 0; j < kExpertBlockWeightRows / kRowStep; ++j) {
        const int r = row0 + kRowStep * j;
        const bool valid = r < b.weight_rows;
        const uint8_t* src = wq + static_cast<int64_t>(b.n_block + (valid ? r : 0)) * w.k_padded + k0 + piece * 16;
        cp_async16(stage + swizzled_piece_offset(r, piece), src, valid);
      }
#pragma unroll
      for (int term = 0; term < kTerms; ++term) {
#pragma unroll
        for (int j = 0; j < XPieces::kPerThread; ++j)
          cp_async16(stage + L::kXOffset + swizzled_piece_offset(L::stacked_row(row0 + kRowStep * j, term), piece),
                     x.src[j] + term * term_bytes + k0, x.valid[j]);
        if (static_cast<int>(threadIdx.x) < kRows)
          cp_async4(stage + L::kScaleOffset + 4 * (term * kRows + threadIdx.x),
                    scale_src + term * a.x_term_rows + s * a.x_scale_rows, scale_valid);
      }
    };

    // acc[h][4 j + e]: weight row 64 h + 16 warp + g (+ 8 for e >= 2) × x row 8 j + 2 t + e % 2.
    float acc[2][kRows / 2] = {};
    start_cp_async_pipeline<L::kStages>(issue, num_stages);
    for (int s = 0; s < num_stages; ++s) {
      cp_async_wait<L::kStages - 2>();
      fence_shared_for_wgmma();
      __syncthreads();  // stage s is in place; every warp is done with stage s - 1, which is refilled now
      if (s + L::kStages - 1 < num_stages) issue(s + L::kStages - 1);
      cp_async_commit();

      const uint32_t stage_addr = smem_addr + (s % L::kStages) * L::kStageBytes;
      const uint64_t desc_w[2] = {wgmma_descriptor_sw128(stage_addr),
                                  wgmma_descriptor_sw128(stage_addr + kHalfRows * kStageK)};
      float w_scale[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) w_scale[h] = w_scale_valid[h] ? __ldg(w_scales[h] + s) : 0.0f;
      // part[h][4 j + e]: as acc, x row 8 (j / kTerms) + 2 t + e % 2 of term j % kTerms.
      float part[2][L::kN / 2];
      wgmma_fence();
      const uint64_t desc_x = wgmma_descriptor_sw128(stage_addr + L::kXOffset);
      // A 32-byte k-step advances a descriptor's address field (bytes / 16) by 2.
      wgmma_m64k32_e4m3<L::kN, false>(part[0], desc_w[0], desc_x);
      wgmma_m64k32_e4m3<L::kN, false>(part[1], desc_w[1], desc_x);
#pragma unroll
      for (int kk = 1; kk < kStageK / 32; ++kk) {
        wgmma_m64k32_e4m3<L::kN, true>(part[0], desc_w[0] + 2 * kk, desc_x + 2 * kk);
        wgmma_m64k32_e4m3<L::kN, true>(part[1], desc_w[1] + 2 * kk, desc_x + 2 * kk);
      }
      wgmma_commit();
      wgmma_wait_all();
      wgmma_fence_registers(part[0]);
      wgmma_fence_registers(part[1]);

      // [kTerms][kRows]
      const float* x_scales =
          reinterpret_cast<const float*>(smem + (s % L::kStages) * L::kStageBytes + L::kScaleOffset);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int group = 0; group < kRows / 8; ++group) {
#pragma unroll
          for (int term = 0; term < kTerms; ++term) {
            const int j = kTerms * group + term;
            const float2 xs = *reinterpret_cast<const float2*>(x_scales + term * kRows + 8 * group + 2 * t);
            const float s0 = w_scale[h] * xs.x, s1 = w_scale[h] * xs.y;
            acc[h][4 * group + 0] += part[h][4 * j + 0] * s0;
            acc[h][4 * group + 1] += part[h][4 * j + 1] * s1;
            acc[h][4 * group + 2] += part[h][4 * j + 2] * s0;
            acc[h][4 * group + 3] += part[h][4 * j + 3] * s1;
          }
        }
      }
    }

    // The block's finished tiles, one per 32 weight rows: [kRows x rows][32 weight rows].
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages
    float* tiles = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int weight_row = h * kHalfRows + 16 * warp + g + (e >= 2 ? 8 : 0);
        float* tile = tiles + (weight_row / kGemmTileRows) * kRows * kGemmTileRows + weight_row % kGemmTileRows;
#pragma unroll
        for (int j = 0; j < kRows / 8; ++j) tile[(8 * j + 2 * t + e % 2) * kGemmTileRows] = acc[h][4 * j + e];
      }
    __syncthreads();
    if (b.has_tile) store_expert_tile(a, tiles + warp * kRows * kGemmTileRows, b.n0, pass_begin, pass_rows);
    __syncthreads();  // the tiles' memory is the next pass's pipeline
  }
}

template <int kRows, int kTerms = 1>
void launch_with(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks, Stream stream) {
  launch_expert_blocks<expert_gemm_wgmma_kernel<kRows, kTerms>>(args, max_n_padded, max_row_blocks, kThreads,
                                                                Layout<kRows, kTerms>::kBytes, stream);
}

}  // namespace

void launch_expert_gemm_fp8_activations(const GroupedGemmArgs& args, int max_n_padded, int max_row_blocks,
                                        int rows_hint, Stream stream) {
  DS_CHECK(args.groups != nullptr && args.k_splits == 1 && args.weights_fp8 && args.xq != nullptr &&
           args.x_scales != nullptr && args.ldx % 16 == 0);
  // Rows per pass from the typical rows per expert (never the result), unless the caller sets
  // them: 64 takes a whole row-block in one pass, 32 halves the products and the x copies.
  DS_CHECK(args.pass_rows == 0 || args.pass_rows == 32 || args.pass_rows == 64);
  DS_CHECK_MSG(args.x_terms >= 1 && args.x_terms <= kMaxFp8ActivationTerms &&
                   (args.x_terms == 1 || args.x_term_rows > 0),
               "expert blocks: " << args.x_terms << " e4m3 terms of " << args.x_term_rows << " rows");
  // Terms take passes of 32 rows (64 would not fit two blocks per SM).
  if (args.x_terms == 2) return launch_with<32, 2>(args, max_n_padded, max_row_blocks, stream);
  if (args.x_terms == 3) return launch_with<32, 3>(args, max_n_padded, max_row_blocks, stream);
  const int pass_rows = args.pass_rows != 0 ? args.pass_rows : rows_hint <= kPassRows32MaxHint ? 32 : 64;
  if (pass_rows == 32) launch_with<32>(args, max_n_padded, max_row_blocks, stream);
  else launch_with<64>(args, max_n_padded, max_row_blocks, stream);
}

}  // namespace dsinfer::cuda
