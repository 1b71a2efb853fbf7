// cuBLASLt's copy of an e4m3 gate/up weight with its halves one after the other. The packed
// layout interleaves the halves by 16 rows (packed_weight.h), which the own kernels' epilogues
// need; a 128-row block of it then mixes rows of two source blocks, so cuBLASLt scales it per row
// (its VEC128 mode), and V2-Lite's shared gate/up product ran at 970 TFLOP/s where the query
// product in the 128 × 128 block mode ran at 1,160 (bench/RESULTS.md, 2026-12-02). In this copy
// every 128-row block is one source block again.
#include "backend/cuda/gate_up_halves.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_launch.cuh"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kBlockRows = 128;

// The packed row holding row r of the copy (gate rows [0, inter_padded), then the up rows).
__device__ __forceinline__ int64_t packed_row_of(int64_t r, int64_t inter_padded) {
  const int64_t half = r >= inter_padded ? 1 : 0, j = r - half * inter_padded;
  return j / kGemmGateUpHalf * kGemmTileRows + half * kGemmGateUpHalf + j % kGemmGateUpHalf;
}

// A block per row of the copy, 16-byte pieces.
__global__ void __launch_bounds__(kThreads) halves_rows_kernel(const uint8_t* src, int64_t k_padded,
                                                              int64_t inter_padded, uint8_t* dst) {
  const int64_t r = blockIdx.x;
  const auto* from = reinterpret_cast<const uint4*>(src + packed_row_of(r, inter_padded) * k_padded);
  auto* to = reinterpret_cast<uint4*>(dst + r * k_padded);
  for (int64_t i = threadIdx.x; i < k_padded / 16; i += kThreads) to[i] = from[i];
}

// A thread per (128-row block, 128-column tile): the block's scale is its first row's.
__global__ void __launch_bounds__(kThreads) halves_scales_kernel(const float* src_scales, int64_t n_padded,
                                                                int64_t scale_cols, int64_t library_block_cols,
                                                                float* dst_scales) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n_padded / kBlockRows * scale_cols) return;
  const int64_t b = i / scale_cols, c = i % scale_cols;
  const int64_t packed = packed_row_of(b * kBlockRows, n_padded / 2);
  dst_scales[b * library_block_cols + c] = src_scales[packed / kGemmGateUpHalf * scale_cols + c];
}

}  // namespace

void launch_gate_up_halves(const GemmWeight& src, void* dst_data, float* dst_scales, int64_t library_block_cols,
                           Stream stream) {
  const int64_t n_padded = src.n_padded, k_padded = src.k_padded, scale_cols = k_padded / kBlockRows;
  DS_CHECK_MSG(src.scales != nullptr && n_padded % (2 * kBlockRows) == 0 && k_padded % kBlockRows == 0 &&
                   library_block_cols >= scale_cols,
               "gate/up halves: an e4m3 gate/up of whole 128-row halves and 128-column tiles");
  if (n_padded == 0) return;
  DS_CUDA_CHECK(cudaMemsetAsync(dst_scales, 0, n_padded / kBlockRows * library_block_cols * sizeof(float), stream));
  halves_rows_kernel<<<static_cast<unsigned>(n_padded), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(src.data), k_padded, n_padded / 2, static_cast<uint8_t*>(dst_data));
  DS_CUDA_CHECK_LAUNCH();
  const int64_t entries = n_padded / kBlockRows * scale_cols;
  halves_scales_kernel<<<static_cast<unsigned>((entries + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      src.scales, n_padded, scale_cols, library_block_cols, dst_scales);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace dsinfer::cuda
