// model_flops against counts worked out by hand from tests/data/tiny_v3/config.json.
#include "model/model_flops.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace dsinfer {
namespace {

ModelConfig tiny_v3() { return ModelConfig::load(std::string(DSINFER_SOURCE_DIR) + "/tests/data/tiny_v3"); }

// tiny_v3: hidden 64, 4 heads, q_lora 48, kv_lora 32, rope 16, nope 24 (qk 40), v 20,
// 3 layers of which layer 0 is dense (intermediate 160), layers 1-2 MoE with 16 experts top-4,
// 1 shared, moe_intermediate 32; vocab 512.
//   attention per layer: q_a 64*48 = 3072, q_b 48*4*40 = 7680, kv_a 64*(32+16) = 3072,
//                        kv_b 32*4*(24+20) = 5632, o 4*20*64 = 5120        → 24576
//   dense MLP:           3*64*160                                          → 30720
//   MoE layer:           (1 shared + 4 routed) * 3*64*32 = 30720, router 64*16 = 1024 → 31744
//   total: 3*24576 + 30720 + 2*31744 = 167936 weights → 335872 FLOPs per token
constexpr double kLinearPerToken = 335872;
constexpr double kLmHeadPerRow = 2.0 * 512 * 64;            // 65536
constexpr double kAttentionPerContextToken = 2.0 * 3 * 4 * (40 + 20);  // 1440

TEST(ModelFlopsTest, TinyV3PerTokenCountsMatchHandComputation) {
  const ModelFlops f = model_flops(tiny_v3());
  EXPECT_DOUBLE_EQ(f.linear_per_token, kLinearPerToken);
  EXPECT_DOUBLE_EQ(f.lm_head_per_row, kLmHeadPerRow);
  EXPECT_DOUBLE_EQ(f.attention_per_context_token, kAttentionPerContextToken);
}

TEST(ModelFlopsTest, TinyV3PrefillStepMatchesHandComputation) {
  // Two prompts of 10 tokens: 20 tokens of weights, contexts 1..10 twice (2 * 55 = 110
  // context tokens), and one logits row per prompt.
  const double expected = 20 * kLinearPerToken + 110 * kAttentionPerContextToken + 2 * kLmHeadPerRow;
  EXPECT_DOUBLE_EQ(expected, 7006912.0);
  EXPECT_DOUBLE_EQ(prefill_step_flops(tiny_v3(), 2, 10), expected);
}

TEST(ModelFlopsTest, ChunkAfterCachedPrefixCountsTheLongerContexts) {
  const ModelConfig c = tiny_v3();
  // 4 new tokens after 6 cached ones attend to 7, 8, 9 and 10 positions (34 in all).
  EXPECT_DOUBLE_EQ(chunk_flops(c, 6, 4, 1), 4 * kLinearPerToken + 34 * kAttentionPerContextToken + kLmHeadPerRow);
  // A prompt prefilled in two chunks costs what it costs in one, less the first chunk's logits.
  EXPECT_DOUBLE_EQ(chunk_flops(c, 0, 6, 0) + chunk_flops(c, 6, 4, 1), chunk_flops(c, 0, 10, 1));
  // A decode step of one token at context 11.
  EXPECT_DOUBLE_EQ(chunk_flops(c, 10, 1, 1), kLinearPerToken + 11 * kAttentionPerContextToken + kLmHeadPerRow);
}

TEST(ModelFlopsTest, WithoutQLoraCountsTheSingleQProjection) {
  // A V2-Lite-like layout (q_proj instead of q_a/q_b), one dense layer only, to isolate q.
  nlohmann::json j = {{"architectures", {"DeepseekV2ForCausalLM"}}, {"model_type", "deepseek_v2"},
                      {"vocab_size", 100}, {"hidden_size", 32}, {"intermediate_size", 48},
                      {"moe_intermediate_size", 8}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                      {"n_shared_experts", 1}, {"n_routed_experts", 4}, {"num_experts_per_tok", 2},
                      {"first_k_dense_replace", 1}, {"q_lora_rank", nullptr}, {"kv_lora_rank", 16},
                      {"qk_rope_head_dim", 8}, {"qk_nope_head_dim", 8}, {"v_head_dim", 8},
                      {"max_position_embeddings", 64}, {"bos_token_id", 0}, {"eos_token_id", 1}};
  const ModelConfig c = ModelConfig::from_json(j, "inline");
  // q 32*2*16 = 1024, kv_a 32*(16+8) = 768, kv_b 16*2*(8+8) = 512, o 2*8*32 = 512,
  // dense MLP 3*32*48 = 4608 → 7424 weights.
  const ModelFlops f = model_flops(c);
  EXPECT_DOUBLE_EQ(f.linear_per_token, 2.0 * 7424);
  EXPECT_DOUBLE_EQ(f.attention_per_context_token, 2.0 * 1 * 2 * (16 + 8));
}

}  // namespace
}  // namespace dsinfer
