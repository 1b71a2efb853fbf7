#include "model/expected_tensors.h"

#include <algorithm>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/safetensors_writer.h"
#include "model_test_util.h"

namespace dsinfer {
namespace {

using nlohmann::json;
using testing::add_expected;
using testing::ScratchDir;
using testing::tiny_v3_config;
using testing::tiny_v3_config_json;

const ExpectedTensor* find(const std::vector<ExpectedTensor>& list, const std::string& name) {
  auto it = std::find_if(list.begin(), list.end(), [&](const ExpectedTensor& t) { return t.name == name; });
  return it == list.end() ? nullptr : &*it;
}

// Writes `w` as the checkpoint of a fresh directory and validates it against `config`;
// returns the error message ("" when valid).
std::string validate_written(const ScratchDir& dir, const SafetensorsWriter& w, const ModelConfig& config) {
  w.write(dir.file("model.safetensors"));
  auto ckpt = Checkpoint::open(dir.path());
  try {
    validate_checkpoint(*ckpt, config);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

TEST(ExpectedTensorsTest, TinyV3List) {
  const ModelConfig c = tiny_v3_config();
  const auto list = expected_tensors(c);
  std::set<std::string> names;
  for (const auto& t : list) EXPECT_TRUE(names.insert(t.name).second) << "duplicate " << t.name;

  const ExpectedTensor* q_b = find(list, "model.layers.0.self_attn.q_b_proj.weight");
  ASSERT_NE(q_b, nullptr);
  EXPECT_EQ(q_b->shape, (std::vector<int64_t>{2 * 8, 8}));  // heads * (nope + rope), q_lora
  EXPECT_TRUE(q_b->quantizable);
  EXPECT_EQ(find(list, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight")->shape,
            (std::vector<int64_t>{8 + 4, 16}));
  EXPECT_EQ(find(list, "model.layers.0.self_attn.kv_b_proj.weight")->shape, (std::vector<int64_t>{2 * (4 + 4), 8}));
  EXPECT_EQ(find(list, "model.layers.0.self_attn.o_proj.weight")->shape, (std::vector<int64_t>{16, 2 * 4}));
  // Layer 0 is dense, layer 1 MoE.
  EXPECT_EQ(find(list, "model.layers.0.mlp.gate_proj.weight")->shape, (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(find(list, "model.layers.1.mlp.gate_proj.weight"), nullptr);
  EXPECT_EQ(find(list, "model.layers.1.mlp.gate.weight")->shape, (std::vector<int64_t>{4, 16}));
  EXPECT_FALSE(find(list, "model.layers.1.mlp.gate.weight")->quantizable);
  EXPECT_EQ(find(list, "model.layers.1.mlp.gate.e_score_correction_bias")->shape, std::vector<int64_t>{4});
  EXPECT_EQ(find(list, "model.layers.1.mlp.experts.3.down_proj.weight")->shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(find(list, "model.layers.1.mlp.shared_experts.up_proj.weight")->shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(find(list, "lm_head.weight")->shape, (std::vector<int64_t>{32, 16}));
  // The MTP layer is layer 2, optional, MoE, with its extra tensors.
  const ExpectedTensor* eh = find(list, "model.layers.2.eh_proj.weight");
  ASSERT_NE(eh, nullptr);
  EXPECT_EQ(eh->shape, (std::vector<int64_t>{16, 32}));
  EXPECT_TRUE(eh->optional);
  EXPECT_EQ(eh->mtp_layer, 2);
  EXPECT_TRUE(find(list, "model.layers.2.mlp.experts.0.gate_proj.weight")->optional);
  EXPECT_EQ(find(list, "model.layers.2.shared_head.head.weight")->shape, (std::vector<int64_t>{32, 16}));
  EXPECT_TRUE(find(list, "model.layers.2.embed_tokens.weight")->optional);
  EXPECT_EQ(find(list, "model.layers.2.embed_tokens.weight")->mtp_layer, -1);
  EXPECT_FALSE(find(list, "model.layers.1.input_layernorm.weight")->optional);
}

TEST(ExpectedTensorsTest, V2LiteUsesQProjAndNoBias) {
  json j = tiny_v3_config_json();
  j["architectures"] = {"DeepseekV2ForCausalLM"};
  j["model_type"] = "deepseek_v2";
  j["q_lora_rank"] = nullptr;
  j["topk_method"] = "greedy";
  j["scoring_func"] = "softmax";
  j["num_nextn_predict_layers"] = 0;
  j["tie_word_embeddings"] = true;
  const auto list = expected_tensors(ModelConfig::from_json(j, "x"));
  EXPECT_EQ(find(list, "model.layers.0.self_attn.q_proj.weight")->shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(find(list, "model.layers.0.self_attn.q_a_proj.weight"), nullptr);
  EXPECT_EQ(find(list, "model.layers.1.mlp.gate.e_score_correction_bias"), nullptr);
  EXPECT_EQ(find(list, "lm_head.weight"), nullptr);
  EXPECT_EQ(find(list, "model.layers.2.input_layernorm.weight"), nullptr);
}

TEST(ExpectedTensorsTest, FullV3Count) {
  // 61 layers, 58 of them MoE with 256 experts: the count the hub's index lists (without scales).
  json j = {{"architectures", {"DeepseekV3ForCausalLM"}}, {"num_nextn_predict_layers", 1}};
  const auto list = expected_tensors(ModelConfig::from_json(j, "x"));
  const size_t per_layer_attn = 2 + 5 + 2;  // norms, q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o
  const size_t dense = 3 * (per_layer_attn + 3);
  const size_t moe = 59 * (per_layer_attn + 2 + 256 * 3 + 3);  // 58 + the MTP layer
  const size_t mtp_extra = 6;
  EXPECT_EQ(list.size(), 3 + dense + moe + mtp_extra);
}

TEST(ValidateCheckpointTest, CompleteBf16CheckpointPasses) {
  ScratchDir dir;
  const ModelConfig c = tiny_v3_config();
  SafetensorsWriter w;
  add_expected(w, c, /*with_mtp=*/true, /*fp8=*/false);
  EXPECT_EQ(validate_written(dir, w, c), "");
}

TEST(ValidateCheckpointTest, MtpLayerMayBeAbsentButNotPartial) {
  const ModelConfig c = tiny_v3_config();
  {
    ScratchDir dir;
    SafetensorsWriter w;
    add_expected(w, c, /*with_mtp=*/false, false);
    EXPECT_EQ(validate_written(dir, w, c), "");
    auto ckpt = Checkpoint::open(dir.path());
    EXPECT_FALSE(has_mtp_layer(*ckpt, c, 2));
  }
  ScratchDir dir;
  SafetensorsWriter w;
  add_expected(w, c, false, false);
  w.add_zeros("model.layers.2.enorm.weight", DType::kBF16, {16});
  const std::string msg = validate_written(dir, w, c);
  EXPECT_NE(msg.find("1 problem"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MTP layer 2 is incomplete: 1 of "), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing e.g. model.layers.2.input_layernorm.weight [16]"), std::string::npos) << msg;
}

TEST(ValidateCheckpointTest, MissingTensor) {
  ScratchDir dir;
  const ModelConfig c = tiny_v3_config();
  SafetensorsWriter w;
  for (const ExpectedTensor& t : expected_tensors(c)) {
    if (!t.optional && t.name != "model.layers.1.mlp.experts.2.up_proj.weight") w.add_zeros(t.name, DType::kBF16, t.shape);
  }
  const std::string msg = validate_written(dir, w, c);
  EXPECT_NE(msg.find(dir.path()), std::string::npos) << msg;
  EXPECT_NE(msg.find("1 problem"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing tensor model.layers.1.mlp.experts.2.up_proj.weight [8, 16]"), std::string::npos) << msg;
}

TEST(ValidateCheckpointTest, UnexpectedTensor) {
  ScratchDir dir;
  const ModelConfig c = tiny_v3_config();
  SafetensorsWriter w;
  add_expected(w, c, false, false);
  w.add_zeros("model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {2});
  w.add_zeros("model.layers.1.mlp.experts.4.up_proj.weight", DType::kBF16, {8, 16});  // only 4 experts
  const std::string msg = validate_written(dir, w, c);
  EXPECT_NE(msg.find("2 problems"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected tensor model.layers.0.self_attn.rotary_emb.inv_freq"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected tensor model.layers.1.mlp.experts.4.up_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
}

TEST(ValidateCheckpointTest, WrongShape) {
  ScratchDir dir;
  const ModelConfig c = tiny_v3_config();
  SafetensorsWriter w;
  for (const ExpectedTensor& t : expected_tensors(c)) {
    if (t.optional) continue;
    if (t.name == "model.layers.0.self_attn.kv_b_proj.weight") {
      w.add_zeros(t.name, DType::kBF16, {8, 16});  // transposed
    } else {
      w.add_zeros(t.name, DType::kBF16, t.shape);
    }
  }
  const std::string msg = validate_written(dir, w, c);
  EXPECT_NE(msg.find("tensor model.layers.0.self_attn.kv_b_proj.weight has shape [8, 16], expected [16, 8]"),
            std::string::npos)
      << msg;
}

TEST(ValidateCheckpointTest, WrongDtype) {
  ScratchDir dir;
  const ModelConfig c = tiny_v3_config();
  SafetensorsWriter w;
  for (const ExpectedTensor& t : expected_tensors(c)) {
    if (t.optional) continue;
    w.add_zeros(t.name, t.name == "model.norm.weight" ? DType::kI32 : DType::kBF16, t.shape);
  }
  std::string msg = validate_written(dir, w, c);
  EXPECT_NE(msg.find("tensor model.norm.weight has dtype I32"), std::string::npos) << msg;

  // An fp8 norm is wrong even in an fp8 checkpoint: only linear weights are quantized.
  json j = tiny_v3_config_json();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {8, 8}}};
  const ModelConfig fp8 = ModelConfig::from_json(j, "x");
  ScratchDir dir2;
  SafetensorsWriter w2;
  for (const ExpectedTensor& t : expected_tensors(fp8)) {
    if (t.optional) continue;
    w2.add_zeros(t.name, t.name == "model.layers.0.input_layernorm.weight" ? DType::kF8E4M3 : DType::kBF16, t.shape);
  }
  msg = validate_written(dir2, w2, fp8);
  EXPECT_NE(msg.find("tensor model.layers.0.input_layernorm.weight has dtype F8_E4M3"), std::string::npos) << msg;
}

TEST(ValidateCheckpointTest, Fp8WeightsNeedWellShapedScales) {
  json j = tiny_v3_config_json();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {8, 8}}};
  const ModelConfig c = ModelConfig::from_json(j, "x");
  {
    ScratchDir dir;
    SafetensorsWriter w;
    add_expected(w, c, /*with_mtp=*/true, /*fp8=*/true);
    EXPECT_EQ(validate_written(dir, w, c), "");
  }
  ScratchDir dir;
  SafetensorsWriter w;
  const std::string no_scale = "model.layers.0.self_attn.q_a_proj.weight";      // [8, 16]
  const std::string bad_scale = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight";  // [12, 16] -> [2, 2]
  const std::string bf16_scale = "model.layers.0.self_attn.o_proj.weight";
  for (const ExpectedTensor& t : expected_tensors(c)) {
    if (t.optional) continue;
    if (!t.quantizable) {
      w.add_zeros(t.name, DType::kBF16, t.shape);
      continue;
    }
    w.add_zeros(t.name, DType::kF8E4M3, t.shape);
    if (t.name == no_scale) continue;
    if (t.name == bad_scale) {
      w.add_zeros(t.name + "_scale_inv", DType::kF32, {1, 2});
    } else if (t.name == bf16_scale) {
      w.add_zeros(t.name + "_scale_inv", DType::kBF16, fp8_scale_shape(t.shape, c.fp8));
    } else {
      w.add_zeros(t.name + "_scale_inv", DType::kF32, fp8_scale_shape(t.shape, c.fp8));
    }
  }
  const std::string msg = validate_written(dir, w, c);
  EXPECT_NE(msg.find("3 problems"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing tensor " + no_scale + "_scale_inv [1, 2]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor " + bad_scale + "_scale_inv has shape [1, 2], expected [2, 2]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor " + bf16_scale + "_scale_inv has dtype BF16, expected F32"), std::string::npos) << msg;
}

TEST(ValidateCheckpointTest, Fp8WithoutQuantizationConfigAndStrayScales) {
  const ModelConfig c = tiny_v3_config();  // no quantization_config
  ScratchDir dir;
  SafetensorsWriter w;
  for (const ExpectedTensor& t : expected_tensors(c)) {
    if (t.optional) continue;
    w.add_zeros(t.name, t.name == "model.layers.0.mlp.up_proj.weight" ? DType::kF8E4M3 : DType::kBF16, t.shape);
  }
  w.add_zeros("model.layers.0.mlp.down_proj.weight_scale_inv", DType::kF32, {1, 1});
  const std::string msg = validate_written(dir, w, c);
  EXPECT_NE(msg.find("model.layers.0.mlp.up_proj.weight is F8_E4M3 but config.json has no fp8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected tensor model.layers.0.mlp.down_proj.weight_scale_inv (its weight is BF16"),
            std::string::npos)
      << msg;
}

TEST(ValidateCheckpointTest, ListsOnlyTheFirstProblems) {
  ScratchDir dir;
  const ModelConfig c = tiny_v3_config();
  SafetensorsWriter w;
  w.add_zeros("model.norm.weight", DType::kBF16, {16});
  const std::string msg = validate_written(dir, w, c);
  EXPECT_NE(msg.find("first 20"), std::string::npos) << msg;
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 20) << msg;
}

}  // namespace
}  // namespace dsinfer
