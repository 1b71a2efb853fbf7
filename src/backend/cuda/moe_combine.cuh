// The MoE combine of one token's columns: its routed rows times their weights in slot order, plus
// the shared experts' row, into the output or into the residual with the norm's output before its
// 1 / rms. Shared by the combine kernel (cuda_moe.cu) and the routed down product that combines
// each column slice as its last expert's block finishes it (few_row_gemm_combine.cu), so that
// both give the same bits.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/row_rms.cuh"
#include "backend/cuda/vector_load.cuh"

namespace dsinfer::cuda::moe {

__device__ __forceinline__ void load_values(const float* p, float (&v)[1]) { v[0] = *p; }
__device__ __forceinline__ void load_values(const float* p, float (&v)[4]) { load4(p, v); }
__device__ __forceinline__ void load_values(const __nv_bfloat16* p, float (&v)[1]) { v[0] = __bfloat162float(*p); }
__device__ __forceinline__ void load_values(const __nv_bfloat16* p, float (&v)[4]) { load4(p, v); }

// Columns [c, c + kWidth) of token t (hidden and ld_expert multiples of kWidth, buffers aligned
// to kWidth elements); each column's sum runs in slot order, as the scalar version's. With r.x
// (kWidth 4), the sums go to the residual and the norm's output before its 1 / rms instead of out.
template <typename T, int kWidth>
__device__ __forceinline__ void combine_columns(const T* expert_out, int64_t ld_expert, const int32_t* slot_row,
                                                const float* weights, const float* shared, int64_t t, int top_k,
                                                int64_t hidden, int64_t c, float* out, const ResidualNormOutput& r,
                                                int slots_at_once) {
  // The residual form's reads and the shared row, requested with the first slots' rows.
  float4 residual = make_float4(0.0f, 0.0f, 0.0f, 0.0f), norm_w = residual;
  if constexpr (kWidth == 4) {
    if (r.x != nullptr) {
      residual = *reinterpret_cast<const float4*>(r.x + t * hidden + c);
      norm_w = __ldg(reinterpret_cast<const float4*>(r.w + c));
    }
  }
  float shared_v[kWidth] = {};
  if (shared != nullptr) load_values(shared + t * hidden + c, shared_v);
  float acc[kWidth] = {};
  for (int first = 0; first < top_k; first += slots_at_once) {
    const int n = min(slots_at_once, top_k - first);
    const int32_t* rows = slot_row + t * top_k + first;
    const float* w = weights + t * top_k + first;
    int64_t row_at[kMoeCombineSlotsAtOnce];
    float w_at[kMoeCombineSlotsAtOnce], v[kMoeCombineSlotsAtOnce][kWidth];
#pragma unroll
    for (int k = 0; k < kMoeCombineSlotsAtOnce; ++k)
      if (k < n) {
        row_at[k] = rows[k];
        w_at[k] = w[k];
      }
#pragma unroll
    for (int k = 0; k < kMoeCombineSlotsAtOnce; ++k)
      if (k < n) load_values(expert_out + row_at[k] * ld_expert + c, v[k]);
#pragma unroll
    for (int k = 0; k < kMoeCombineSlotsAtOnce; ++k)
      if (k < n)
        for (int j = 0; j < kWidth; ++j) acc[j] += w_at[k] * v[k][j];
  }
  if (shared != nullptr)
    for (int j = 0; j < kWidth; ++j) acc[j] += shared_v[j];
  if constexpr (kWidth == 4) {
    if (r.x != nullptr) {
      const int64_t i = t * hidden + c;
      store_residual_norm(r, i, i / 4, residual, norm_w, acc);
      return;
    }
  }
  for (int j = 0; j < kWidth; ++j) out[t * hidden + c + j] = acc[j];
}

}  // namespace dsinfer::cuda::moe
