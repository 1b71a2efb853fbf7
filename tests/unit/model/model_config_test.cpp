#include "model/model_config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model_test_util.h"

namespace dsinfer {
namespace {

using nlohmann::json;
using testing::ScratchDir;
using testing::tiny_v3_config_json;

// Expects from_json to throw an Error whose message names the source and the field.
void expect_config_error(const json& j, const std::string& field, const std::string& also = "") {
  try {
    ModelConfig::from_json(j, "dir/config.json");
    FAIL() << "expected an error about " << field;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("dir/config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"" + field + "\""), std::string::npos) << msg;
    if (!also.empty()) {
      EXPECT_NE(msg.find(also), std::string::npos) << msg;
    }
  }
}

// The config.json of deepseek-ai/DeepSeek-V3 (fields that matter here).
json v3_hub_config() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
    "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
    "v_head_dim": 128, "vocab_size": 129280})");
}

// The config.json of deepseek-ai/DeepSeek-V2-Lite (fields that matter here).
json v2_lite_hub_config() {
  return json::parse(R"({
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
    "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
    "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "moe_intermediate_size": 1408, "moe_layer_freq": 1,
    "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false,
    "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
    "num_key_value_heads": 16, "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128,
    "vocab_size": 102400})");
}

TEST(ModelConfigTest, ParsesV3HubConfig) {
  ModelConfig c = ModelConfig::from_json(v3_hub_config(), "v3/config.json");
  EXPECT_EQ(c.architecture, "DeepseekV3ForCausalLM");
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSigmoid);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 40.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rope_scaling.mscale_all_dim, 1.0);
  EXPECT_TRUE(c.fp8.enabled);
  EXPECT_EQ(c.fp8.block_rows, 128);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{1});
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(60));
  EXPECT_TRUE(c.is_moe_layer(61));  // the MTP layer is MoE too
}

TEST(ModelConfigTest, ParsesV2LiteWithNullQLoraRank) {
  ModelConfig c = ModelConfig::from_json(v2_lite_hub_config(), "v2lite/config.json");
  EXPECT_EQ(c.architecture, "DeepseekV2ForCausalLM");
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSoftmax);
  EXPECT_FALSE(c.fp8.enabled);
  EXPECT_EQ(c.bos_token_id, 100000);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.mscale, 0.707);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
}

TEST(ModelConfigTest, MissingFieldsTakeFamilyDefaults) {
  ModelConfig v3 = ModelConfig::from_json(json{{"architectures", {"DeepseekV3ForCausalLM"}}}, "a/config.json");
  EXPECT_EQ(v3.vocab_size, 129280);
  EXPECT_EQ(v3.topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(v3.scoring_func, ScoringFunc::kSigmoid);
  EXPECT_EQ(v3.n_group, 8);
  EXPECT_EQ(v3.topk_group, 4);
  EXPECT_EQ(v3.first_k_dense_replace, 3);
  EXPECT_DOUBLE_EQ(v3.routed_scaling_factor, 2.5);
  EXPECT_EQ(v3.bos_token_id, 0);
  EXPECT_EQ(v3.eos_token_ids, std::vector<int>{1});
  EXPECT_EQ(v3.rope_scaling.type, "");
  EXPECT_EQ(v3.model_type, "deepseek_v3");

  // V2's HF default has num_experts_per_tok null, so a V2 config must state it.
  ModelConfig v2 = ModelConfig::from_json(json{{"model_type", "deepseek_v2"}, {"num_experts_per_tok", 6}},
                                          "b/config.json");
  EXPECT_EQ(v2.architecture, "DeepseekV2ForCausalLM");
  EXPECT_EQ(v2.vocab_size, 32000);
  EXPECT_EQ(v2.topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(v2.scoring_func, ScoringFunc::kSoftmax);
  EXPECT_FALSE(v2.norm_topk_prob);
  EXPECT_EQ(v2.n_group, 1);
  EXPECT_EQ(v2.topk_group, 1);
  EXPECT_EQ(v2.first_k_dense_replace, 0);
  EXPECT_EQ(v2.n_routed_experts, 64);
  EXPECT_EQ(v2.moe_intermediate_size, 1407);
  EXPECT_EQ(v2.bos_token_id, 1);
  EXPECT_EQ(v2.eos_token_ids, std::vector<int>{2});
  expect_config_error(json{{"model_type", "deepseek_v2"}}, "num_experts_per_tok");
}

TEST(ModelConfigTest, NullGroupsMeanOneGroup) {
  json j = v2_lite_hub_config();
  j["n_group"] = nullptr;
  j["topk_group"] = nullptr;
  ModelConfig c = ModelConfig::from_json(j, "x");
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
}

TEST(ModelConfigTest, EosMayBeAList) {
  json j = tiny_v3_config_json();
  j["eos_token_id"] = {1, 7, 9};
  EXPECT_EQ(ModelConfig::from_json(j, "x").eos_token_ids, (std::vector<int>{1, 7, 9}));
  j["eos_token_id"] = {1, "two"};
  expect_config_error(j, "eos_token_id");
  j["eos_token_id"] = 4000;
  expect_config_error(j, "eos_token_id", "vocabulary");
}

TEST(ModelConfigTest, UnknownArchitecture) {
  json j = tiny_v3_config_json();
  j["architectures"] = {"LlamaForCausalLM"};
  expect_config_error(j, "architectures", "LlamaForCausalLM");
  j.erase("architectures");
  j["model_type"] = "llama";
  expect_config_error(j, "model_type", "llama");
}

TEST(ModelConfigTest, MissingRequiredField) {
  json j = tiny_v3_config_json();
  j.erase("architectures");
  j.erase("model_type");
  expect_config_error(j, "architectures", "missing");
}

TEST(ModelConfigTest, WrongTypes) {
  json j = tiny_v3_config_json();
  j["hidden_size"] = "16";
  expect_config_error(j, "hidden_size", "integer");
  j = tiny_v3_config_json();
  j["hidden_size"] = 16.5;
  expect_config_error(j, "hidden_size", "integer");
  j = tiny_v3_config_json();
  j["hidden_size"] = 16.0;  // integral floats are fine
  EXPECT_EQ(ModelConfig::from_json(j, "x").hidden_size, 16);
  j["num_hidden_layers"] = 1e12;
  expect_config_error(j, "num_hidden_layers", "large");
  j = tiny_v3_config_json();
  j["norm_topk_prob"] = 1;
  expect_config_error(j, "norm_topk_prob");
  j = tiny_v3_config_json();
  j["rope_theta"] = "big";
  expect_config_error(j, "rope_theta");
  EXPECT_THROW(ModelConfig::from_json(json::array(), "x"), Error);
}

TEST(ModelConfigTest, UnknownEnumValues) {
  json j = tiny_v3_config_json();
  j["topk_method"] = "random";
  expect_config_error(j, "topk_method", "random");
  j = tiny_v3_config_json();
  j["scoring_func"] = "tanh";
  expect_config_error(j, "scoring_func", "tanh");
  j = tiny_v3_config_json();
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  expect_config_error(j, "rope_scaling.type", "dynamic");
  j = tiny_v3_config_json();
  j["quantization_config"] = {{"quant_method", "awq"}};
  expect_config_error(j, "quantization_config.quant_method", "awq");
  j = tiny_v3_config_json();
  j["hidden_act"] = "gelu";
  expect_config_error(j, "hidden_act", "gelu");
  j = tiny_v3_config_json();
  j["attention_bias"] = true;
  expect_config_error(j, "attention_bias");
  j = tiny_v3_config_json();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e5m2"}};
  expect_config_error(j, "quantization_config.fmt", "e5m2");
}

TEST(ModelConfigTest, InconsistentValues) {
  json j = tiny_v3_config_json();
  j["hidden_size"] = 0;
  expect_config_error(j, "hidden_size", "positive");
  j = tiny_v3_config_json();
  j["num_experts_per_tok"] = 5;
  expect_config_error(j, "num_experts_per_tok", "n_routed_experts");
  j = tiny_v3_config_json();
  j["n_group"] = 3;
  expect_config_error(j, "n_group", "divide");
  j = tiny_v3_config_json();
  j["topk_group"] = 3;
  expect_config_error(j, "topk_group", "n_group");
  j = tiny_v3_config_json();
  j["num_experts_per_tok"] = 3;  // one group of two experts cannot supply three
  expect_config_error(j, "num_experts_per_tok", "topk_group");
  j = tiny_v3_config_json();
  j["num_hidden_layers"] = 100000;
  expect_config_error(j, "num_hidden_layers", "implausibly large");
  j = tiny_v3_config_json();
  j["num_hidden_layers"] = 4000;
  j["n_routed_experts"] = 60000;
  j["n_group"] = 1;
  expect_config_error(j, "n_routed_experts", "implausibly large");
  j = tiny_v3_config_json();
  j["qk_rope_head_dim"] = 5;
  expect_config_error(j, "qk_rope_head_dim", "even");
  j = tiny_v3_config_json();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 0.5}, {"original_max_position_embeddings", 64}};
  expect_config_error(j, "rope_scaling.factor");
  j = tiny_v3_config_json();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 0}}};
  expect_config_error(j, "quantization_config.weight_block_size");
}

TEST(ModelConfigTest, RopeParametersOfNewerExports) {
  json j = tiny_v3_config_json();
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 50000.0}};
  ModelConfig c = ModelConfig::from_json(j, "x");
  EXPECT_EQ(c.rope_scaling.type, "");
  EXPECT_DOUBLE_EQ(c.rope_theta, 50000.0);
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0},
                          {"original_max_position_embeddings", 32}};
  c = ModelConfig::from_json(j, "x");
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 32);
}

TEST(ModelConfigTest, MoeLayerFrequency) {
  json j = tiny_v3_config_json();
  j["num_hidden_layers"] = 6;
  j["moe_layer_freq"] = 2;
  ModelConfig c = ModelConfig::from_json(j, "x");
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_FALSE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(2));
  EXPECT_FALSE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(4));
  j["n_routed_experts"] = nullptr;  // a dense model
  j["num_experts_per_tok"] = nullptr;
  c = ModelConfig::from_json(j, "x");
  EXPECT_FALSE(c.is_moe_layer(4));
}

TEST(ModelConfigTest, LoadReadsDirectory) {
  ScratchDir dir;
  dir.write("config.json", tiny_v3_config_json().dump());
  ModelConfig c = ModelConfig::load(dir.path());
  EXPECT_EQ(c.hidden_size, 16);
  EXPECT_EQ(c.n_routed_experts, 4);
}

TEST(ModelConfigTest, LoadErrorsNameTheFile) {
  ScratchDir dir;
  try {
    ModelConfig::load(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find(dir.file("config.json")), std::string::npos) << e.what();
  }
  dir.write("config.json", std::string(17 << 20, ' '));
  try {
    ModelConfig::load(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("larger than 16 MB"), std::string::npos) << e.what();
  }
  dir.write("config.json", "{\"architectures\": [\"DeepseekV3ForCausalLM\"],");
  try {
    ModelConfig::load(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("config.json")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsinfer
