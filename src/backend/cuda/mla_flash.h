// The fused causal attention kernels of the expanded MLA prefill form, behind
// launch_expanded_flash_attention (cuda_kernels.h): the mma.sync form for every compiled head
// width (mla_flash.cu) and the warpgroup form for DeepSeek's 192 / 128 (mla_flash_wgmma.cu).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {

// Queries bf16 [num_queries, heads, 192]; keys' nope columns and values bf16 [num_keys, heads,
// 128 + 128]; the keys' rope columns, one for all heads, bf16 [num_keys, 64] with rows ld_rope
// elements apart (16-byte aligned); scores in log2 units (scale_log2 = softmax scale · log2 e).
// Output as launch_expanded_flash_attention's.
void launch_flash_attention_wgmma(const uint16_t* queries, const uint16_t* kv, const uint16_t* rope, int64_t ld_rope,
                                  int num_heads, int v_dim, int num_queries, int first_pos, int num_keys,
                                  float scale_log2, float* out, int64_t ld_out, Stream stream);

}  // namespace dsinfer::cuda
