// Model FLOPs of a forward step, counted from the config alone: the figure that prefill
// throughput is compared with the device's measured GEMM rate by (`dsinfer bench`).
//
// Convention (the usual "2 × activated parameters" count, with MLA in its stored, non-absorbed
// form): per token, 2 FLOPs for every weight it multiplies — attention projections as the
// checkpoint stores them (q_proj, or q_a_proj + q_b_proj; kv_a_proj_with_mqa; kv_b_proj;
// o_proj), the dense MLP or the shared experts + top-k routed experts + router of each layer —
// plus, per layer, 2 × heads × (qk_head_dim + v_head_dim) for every token of its causal context
// (QKᵀ and PV). The LM head counts only for the rows that produce logits. Norms, RoPE, softmax
// and routing arithmetic are left out (well under 1% at the shapes that matter); MTP layers too,
// since a plain forward step does not run them.
#pragma once

#include <cstdint>

#include "model/model_config.h"

namespace dsinfer {

struct ModelFlops {
  double linear_per_token = 0;              // 2 × activated weights of all layers, LM head excluded
  double lm_head_per_row = 0;               // 2 × vocab × hidden
  double attention_per_context_token = 0;   // 2 × layers × heads × (qk_head_dim + v_head_dim)
};

ModelFlops model_flops(const ModelConfig& config);

// FLOPs of computing `num_new_tokens` tokens of one sequence whose first `num_cached_tokens`
// are already in the KV cache (token i of the chunk attends to num_cached_tokens + i + 1
// positions), producing logits for `num_logit_rows` of them.
double chunk_flops(const ModelConfig& config, int64_t num_cached_tokens, int64_t num_new_tokens,
                   int64_t num_logit_rows);

// One prefill step of `num_seqs` prompts of `prompt_len_tokens` each after `num_cached_tokens`
// already cached, logits for the last token of every prompt (what `dsinfer bench` runs).
double prefill_step_flops(const ModelConfig& config, int64_t num_seqs, int64_t prompt_len_tokens,
                          int64_t num_cached_tokens = 0);

}  // namespace dsinfer
