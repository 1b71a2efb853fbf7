#include "model/model_flops.h"

namespace dsinfer {

ModelFlops model_flops(const ModelConfig& c) {
  // Work in doubles: the V3 product of vocab, hidden and layers overflows nothing here, but
  // per-token counts times prompt lengths would overflow 32-bit arithmetic quickly.
  const double h = c.hidden_size, heads = c.num_attention_heads;
  const double qk = c.qk_head_dim(), v = c.v_head_dim;
  const double q_proj = c.q_lora_rank > 0 ? h * c.q_lora_rank + static_cast<double>(c.q_lora_rank) * heads * qk
                                          : h * heads * qk;
  const double kv_a = h * (c.kv_lora_rank + c.qk_rope_head_dim);
  const double kv_b = static_cast<double>(c.kv_lora_rank) * heads * (c.qk_nope_head_dim + c.v_head_dim);
  const double o_proj = heads * v * h;
  const double attention = q_proj + kv_a + kv_b + o_proj;
  // gate, up and down projections of one SwiGLU MLP of intermediate size i.
  auto mlp = [h](double i) { return 3.0 * h * i; };

  double weights = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    weights += attention;
    if (c.is_moe_layer(l)) {
      weights += mlp(c.moe_intermediate_size) * (c.n_shared_experts + c.num_experts_per_tok);
      weights += h * c.n_routed_experts;  // router
    } else {
      weights += mlp(c.intermediate_size);
    }
  }
  ModelFlops f;
  f.linear_per_token = 2.0 * weights;
  f.lm_head_per_row = 2.0 * static_cast<double>(c.vocab_size) * h;
  f.attention_per_context_token = 2.0 * c.num_hidden_layers * heads * (qk + v);
  return f;
}

double chunk_flops(const ModelConfig& config, int64_t num_cached_tokens, int64_t num_new_tokens,
                   int64_t num_logit_rows) {
  const ModelFlops f = model_flops(config);
  const double n = static_cast<double>(num_new_tokens);
  // Sum over the chunk of each token's causal context: (cached + 1) + ... + (cached + n).
  const double context_tokens = n * static_cast<double>(num_cached_tokens) + n * (n + 1) / 2;
  return n * f.linear_per_token + context_tokens * f.attention_per_context_token +
         static_cast<double>(num_logit_rows) * f.lm_head_per_row;
}

double prefill_step_flops(const ModelConfig& config, int64_t num_seqs, int64_t prompt_len_tokens,
                          int64_t num_cached_tokens) {
  return static_cast<double>(num_seqs) * chunk_flops(config, num_cached_tokens, prompt_len_tokens, 1);
}

}  // namespace dsinfer
