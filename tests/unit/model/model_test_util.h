// Shared helpers for the model tests: scratch directories, tiny configs, synthetic checkpoints.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/expected_tensors.h"
#include "model/model_config.h"
#include "model/safetensors_writer.h"

namespace dsinfer::testing {

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dsinfer_model_XXXXXX").string();
    char* made = mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr);
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream out(file(name), std::ios::binary);
    out << bytes;
  }

 private:
  std::string path_;
};

// A V3-shaped model small enough to write in full: 2 layers (1 dense, 1 MoE), 1 MTP layer.
inline nlohmann::json tiny_v3_config_json() {
  return nlohmann::json{
      {"architectures", {"DeepseekV3ForCausalLM"}},
      {"model_type", "deepseek_v3"},
      {"vocab_size", 32},
      {"hidden_size", 16},
      {"intermediate_size", 24},
      {"moe_intermediate_size", 8},
      {"num_hidden_layers", 2},
      {"num_attention_heads", 2},
      {"num_key_value_heads", 2},
      {"n_shared_experts", 1},
      {"n_routed_experts", 4},
      {"num_experts_per_tok", 2},
      {"n_group", 2},
      {"topk_group", 1},
      {"topk_method", "noaux_tc"},
      {"scoring_func", "sigmoid"},
      {"norm_topk_prob", true},
      {"routed_scaling_factor", 2.5},
      {"first_k_dense_replace", 1},
      {"moe_layer_freq", 1},
      {"q_lora_rank", 8},
      {"kv_lora_rank", 8},
      {"qk_rope_head_dim", 4},
      {"qk_nope_head_dim", 4},
      {"v_head_dim", 4},
      {"rope_theta", 10000},
      {"rms_norm_eps", 1e-6},
      {"num_nextn_predict_layers", 1},
      {"bos_token_id", 0},
      {"eos_token_id", 1},
      {"max_position_embeddings", 128},
      {"tie_word_embeddings", false},
      {"hidden_act", "silu"},
  };
}

inline ModelConfig tiny_v3_config() { return ModelConfig::from_json(tiny_v3_config_json(), "tiny/config.json"); }

// Adds every expected tensor (MTP ones too when with_mtp), BF16 zeros, or F8_E4M3 with
// well-shaped F32 scales for quantizable weights when fp8 is true.
inline void add_expected(SafetensorsWriter& w, const ModelConfig& c, bool with_mtp, bool fp8) {
  for (const ExpectedTensor& t : expected_tensors(c)) {
    if (t.optional && !with_mtp) continue;
    if (fp8 && t.quantizable) {
      w.add_zeros(t.name, DType::kF8E4M3, t.shape);
      w.add_zeros(t.name + "_scale_inv", DType::kF32, fp8_scale_shape(t.shape, c.fp8));
    } else {
      w.add_zeros(t.name, DType::kBF16, t.shape);
    }
  }
}

}  // namespace dsinfer::testing
