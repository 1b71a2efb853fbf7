// ModelConfig: the fields of a DeepSeek V2/V3 HF config.json that the engine needs, with the
// defaults HF transformers applies for each model_type when a field is absent.
//
// Contract: from_json()/load() either return a config whose values are consistent (positive
// sizes, num_experts_per_tok <= n_routed_experts, n_routed_experts % n_group == 0,
// topk_group <= n_group, ...) or throw dsinfer::Error whose message names the source file and
// the offending field. Unknown extra fields are ignored.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsinfer {

enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };
enum class ScoringFunc { kSoftmax, kSigmoid };

const char* topk_method_name(TopkMethod method);     // "greedy", "group_limited_greedy", "noaux_tc"
const char* scoring_func_name(ScoringFunc func);     // "softmax", "sigmoid"

// rope_scaling in config.json; type "yarn" (or none). HF also accepts the key "rope_type".
struct RopeScaling {
  std::string type;  // "" when absent
  double factor = 1.0;
  int original_max_position_embeddings = 0;
  double beta_fast = 32.0, beta_slow = 1.0, mscale = 1.0, mscale_all_dim = 0.0;
};

// quantization_config {quant_method: "fp8", weight_block_size: [rows, cols]}.
struct Fp8Quantization {
  bool enabled = false;
  int block_rows = 128, block_cols = 128;
};

struct ModelConfig {
  std::string architecture;  // "DeepseekV3ForCausalLM" | "DeepseekV2ForCausalLM"
  std::string model_type;    // "deepseek_v3" | "deepseek_v2"
  int vocab_size = 0, hidden_size = 0, intermediate_size = 0, moe_intermediate_size = 0;
  int num_hidden_layers = 0, num_attention_heads = 0;
  int n_shared_experts = 0, n_routed_experts = 0, num_experts_per_tok = 0;
  int n_group = 1, topk_group = 1;
  TopkMethod topk_method = TopkMethod::kGreedy;
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  int first_k_dense_replace = 0, moe_layer_freq = 1;
  int q_lora_rank = 0;  // 0 when null (V2-Lite: q_proj instead of q_a/q_b)
  int kv_lora_rank = 0, qk_rope_head_dim = 0, qk_nope_head_dim = 0, v_head_dim = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  int num_nextn_predict_layers = 0;
  Fp8Quantization fp8;
  int bos_token_id = 0;
  std::vector<int> eos_token_ids;  // eos may be an int or a list in config.json
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0.
  // MTP layers (layer >= num_hidden_layers) follow the same rule.
  bool is_moe_layer(int layer) const;

  // source_name is used in error messages (normally the config.json path). Throws Error.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source_name);
  // Reads model_dir/config.json. Throws Error (kNotFound when the file is missing).
  static ModelConfig load(const std::string& model_dir);
};

}  // namespace dsinfer
