// The fused causal attention kernels of the expanded MLA prefill form, behind
// launch_expanded_flash_attention (cuda_kernels.h): the mma.sync form for every compiled head
// width (mla_flash.cu) and the warpgroup form for DeepSeek's 192 / 128 (mla_flash_wgmma.cu),
// and the masking and online-softmax steps the two share.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {

// Queries bf16 [num_queries, heads, 192], keys and values bf16 [num_keys, heads, 192 + 128];
// scores in log2 units (scale_log2 = softmax scale · log2 e). Output as
// launch_expanded_flash_attention's.
void launch_flash_attention_wgmma(const uint16_t* queries, const uint16_t* kv, int num_heads, int v_dim,
                                  int num_queries, int first_pos, int num_keys, float scale_log2, float* out,
                                  int64_t ld_out, Stream stream);

#ifdef __CUDACC__
// The device steps both kernels share, over a warp's 16 query rows × 64 keys of scores in
// mma.sync's accumulator layout: score(n, e) is key group n's value e (rows g, g + 8 for e >= 2,
// keys 8 n + 2 t + e % 2), out(n, e) the same for output column group n of kOutGroups.

// Scores to log2 units; keys past a row's position or at key_end and after set to -inf (only
// the steps on the diagonal or at the end have any).
template <int kKeys, typename Score>
__device__ __forceinline__ void scale_and_mask_scores(Score&& score, float scale_log2, int j0, int warp_pos,
                                                      int key_end, int g, int t) {
  const bool masked = j0 + kKeys - 1 > warp_pos || j0 + kKeys > key_end;
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = score(n, e) * scale_log2;
      if (masked) {
        const int key = j0 + n * 8 + 2 * t + (e & 1), pos = warp_pos + g + (e >> 1) * 8;
        if (key > pos || key >= key_end) v = -INFINITY;
      }
      score(n, e) = v;
    }
  }
}

// The online softmax over one step's scores: each row's running max and sum move on, the output
// so far is rescaled, and the scores become their exponentials. Every row sees key 0 at the
// first step, so its max is finite from then on.
template <int kKeys, int kOutGroups, typename Score, typename Out>
__device__ __forceinline__ void online_softmax_step(Score&& score, Out&& out, float (&row_max)[2],
                                                    float (&row_sum)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float m = row_max[i];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) m = fmaxf(m, fmaxf(score(n, 2 * i), score(n, 2 * i + 1)));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float rescale = exp2f(row_max[i] - m);  // 0 at the first step
    row_max[i] = m;
    row_sum[i] *= rescale;
#pragma unroll
    for (int n = 0; n < kOutGroups; ++n) {
      out(n, 2 * i) *= rescale;
      out(n, 2 * i + 1) *= rescale;
    }
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      score(n, 2 * i) = exp2f(score(n, 2 * i) - m);
      score(n, 2 * i + 1) = exp2f(score(n, 2 * i + 1) - m);
      row_sum[i] += score(n, 2 * i) + score(n, 2 * i + 1);
    }
  }
}
#endif

}  // namespace dsinfer::cuda
