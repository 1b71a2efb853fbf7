// Random weights drawn where they are kept: each packed element recomputes its source value from
// its index (core/random_normal.h), so no host memory, no copy across PCIe, and a weight of
// millions of values takes a few launches.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/random_weights.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/random_normal.h"

namespace dsinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlockEdge = kRandomWeightBlockEdge;

struct Source {
  PackedWeightLayout layout;
  uint64_t seeds[2];
  float scale;
  // Source row s (stacked: the up's rows after the gate's), column c.
  __device__ float value(int64_t s, int64_t c) const {
    const int t = layout.gate_up && s >= layout.inter ? 1 : 0;
    const int64_t row = s - t * layout.inter;
    return scale * normal_value(seeds[t], row * layout.cols + c);
  }
};

// Block (source block row, block column): the block's scale, its largest magnitude / 448.
__global__ void __launch_bounds__(kThreads) block_scales_kernel(Source src, float* block_scales) {
  __shared__ float warp_max[kThreads / 32];
  const PackedWeightLayout& l = src.layout;
  // A gate/up's blocks start again at the up's first row (random_weight_source_block).
  const int64_t per_half = l.gate_up ? random_weight_blocks_per_half(l) : INT64_MAX;
  const int64_t half = blockIdx.x >= per_half ? 1 : 0;
  const int64_t half_first = half * l.inter, half_end = l.gate_up ? half_first + l.inter : l.rows;
  const int64_t row0 = half_first + (static_cast<int64_t>(blockIdx.x) - half * per_half) * kBlockEdge;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kBlockEdge;
  const int64_t row_end = min(row0 + kBlockEdge, half_end);
  const int64_t col_end = min(col0 + kBlockEdge, src.layout.cols);
  const int64_t width = col_end - col0, count = (row_end - row0) * width;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += kThreads)
    amax = fmaxf(amax, fabsf(src.value(row0 + i / width, col0 + i % width)));
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
    block_scales[blockIdx.x * gridDim.y + blockIdx.y] = e4m3_block_scale(amax);
  }
}

// Block r: packed row r's values (bf16), or codes (e4m3, by its source block's scale).
__global__ void __launch_bounds__(kThreads) packed_rows_kernel(Source src, void* data, const float* block_scales) {
  const PackedWeightLayout& l = src.layout;
  const int64_t r = blockIdx.x, s = l.source_row(r);
  if (s < 0) return;  // padding rows stay zero
  for (int64_t c = threadIdx.x; c < l.cols; c += kThreads) {
    const float v = src.value(s, c);
    if (l.fp8) {
      const float block_scale = block_scales[random_weight_source_block(l, s) * l.scale_cols + c / kBlockEdge];
      static_cast<uint8_t*>(data)[r * l.k_padded + c] =
          static_cast<uint8_t>(__nv_cvt_float_to_fp8(v / block_scale, __NV_SATFINITE, __NV_E4M3));
    } else {
      static_cast<__nv_bfloat16*>(data)[r * l.k_padded + c] = __float2bfloat16_rn(v);
    }
  }
}

// One thread per (packed row, 128-column tile): the packed scales and cuBLASLt's copy.
__global__ void __launch_bounds__(kThreads) packed_scales_kernel(PackedWeightLayout l, const float* block_scales,
                                                                float* scales, float* library) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= l.n_padded * l.scale_cols) return;
  const int64_t r = i / l.scale_cols, cb = i % l.scale_cols, s = l.source_row(r);
  const float scale = s >= 0 ? block_scales[random_weight_source_block(l, s) * l.scale_cols + cb] : 1.0f;
  if (r % kPackedScaleRows == 0) scales[(r / kPackedScaleRows) * l.scale_cols + cb] = scale;
  if (!l.library_blocks) library[cb * l.n_padded + r] = scale;
  else if (r % kBlockEdge == 0) library[(r / kBlockEdge) * l.library_block_cols + cb] = scale;
}

}  // namespace

void launch_random_packed_weight(const PackedWeightLayout& layout, uint64_t first_seed, uint64_t second_seed,
                                 float scale, void* storage, float* block_scales, Stream stream) {
  DS_CHECK(layout.rows > 0 && layout.cols > 0 && layout.n_padded <= INT32_MAX);
  DS_CHECK_MSG(!layout.fp8 || (block_scales != nullptr && (!layout.gate_up || layout.inter % kPackedScaleRows == 0)),
               "random e4m3 weight: gate and up halves of whole " << kPackedScaleRows
                   << "-row scale groups, and a workspace for the scales");
  const Source src{layout, {first_seed, second_seed}, scale};
  DS_CUDA_CHECK(cudaMemsetAsync(storage, 0, layout.total_bytes(), stream));
  if (layout.fp8) {
    const dim3 blocks(random_weight_block_rows(layout), layout.scale_cols);
    block_scales_kernel<<<blocks, kThreads, 0, stream>>>(src, block_scales);
    DS_CUDA_CHECK_LAUNCH();
  }
  packed_rows_kernel<<<layout.n_padded, kThreads, 0, stream>>>(src, storage, block_scales);
  DS_CUDA_CHECK_LAUNCH();
  if (layout.fp8) {
    auto* base = static_cast<char*>(storage);
    const int64_t entries = layout.n_padded * layout.scale_cols;
    packed_scales_kernel<<<(entries + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        layout, block_scales, reinterpret_cast<float*>(base + layout.data_bytes),
        reinterpret_cast<float*>(base + layout.data_bytes + layout.scale_bytes));
    DS_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace dsinfer::cuda
