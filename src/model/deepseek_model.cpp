#include "model/deepseek_model.h"

#include <algorithm>

#include "core/check.h"
#include "model/checkpoint.h"
#include "model/rope.h"

namespace dsinfer {
namespace {
// q_a_layernorm and kv_a_layernorm use their module's default epsilon in the reference
// implementations, not config.rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;
}  // namespace

DeepseekModel::DeepseekModel(ModelConfig config, ModelWeights weights, Backend& backend, int max_positions)
    : config_(std::move(config)), weights_(std::move(weights)), backend_(backend), max_positions_(max_positions) {
  if (max_positions_ <= 0) max_positions_ = config_.max_position_embeddings;
  const RopeTables tables = make_rope_tables(config_, max_positions_);
  const int64_t half = config_.qk_rope_head_dim / 2;
  rope_cos_ = backend_.from_host(HostTensor{DType::kF32, {max_positions_, half}, tables.cos.data()});
  rope_sin_ = backend_.from_host(HostTensor{DType::kF32, {max_positions_, half}, tables.sin.data()});
  softmax_scale_ = attention_softmax_scale(config_);
}

size_t DeepseekModel::kv_bytes_per_token() const {
  return static_cast<size_t>(config_.num_hidden_layers) * (config_.kv_lora_rank + config_.qk_rope_head_dim) * sizeof(float);
}

KvCaches DeepseekModel::allocate_caches(int num_blocks, int block_size) {
  KvCaches caches;
  caches.num_blocks = num_blocks;
  caches.block_size = block_size;
  const int64_t entry = config_.kv_lora_rank + config_.qk_rope_head_dim;
  for (int i = 0; i < config_.num_hidden_layers; ++i)
    caches.layers.push_back(LayerKvCache{backend_.empty({num_blocks, block_size, entry}, DType::kF32)});
  return caches;
}

void DeepseekModel::attention(const LayerWeights& l, const Tensor& h, const ForwardBatch& batch, LayerKvCache& cache,
                              int block_size, Tensor& out) {
  const int64_t t = h.dim(0);
  const int64_t heads = config_.num_attention_heads;
  Tensor q = backend_.empty({t, heads * config_.qk_head_dim()}, DType::kF32);
  if (l.has_q_lora) {
    Tensor qa = backend_.empty({t, config_.q_lora_rank}, DType::kF32);
    backend_.linear(h, l.q_a, qa);
    backend_.rms_norm(qa, l.q_a_norm, kLatentNormEps, qa);
    backend_.linear(qa, l.q_b, q);
  } else {
    backend_.linear(h, l.q, q);
  }
  Tensor kv_a = backend_.empty({t, config_.kv_lora_rank + config_.qk_rope_head_dim}, DType::kF32);
  backend_.linear(h, l.kv_a, kv_a);
  Tensor attn = backend_.empty({t, heads * config_.v_head_dim}, DType::kF32);
  MlaAttentionArgs args;
  args.weights = &l.mla;
  args.q = &q;
  args.kv_a = &kv_a;
  args.rope_cos = &rope_cos_;
  args.rope_sin = &rope_sin_;
  args.batch = &batch;
  args.cache = &cache;
  args.block_size = block_size;
  args.softmax_scale = softmax_scale_;
  args.latent_norm_eps = kLatentNormEps;
  args.out = &attn;
  backend_.mla_attention(args);
  backend_.linear(attn, l.o_proj, out);
}

void DeepseekModel::mlp(const LayerWeights& l, const Tensor& h, Tensor& out, MoeRouting* routing) {
  if (l.is_moe) {
    backend_.moe(h, l.moe, out, routing);
    return;
  }
  const int64_t t = h.dim(0);
  Tensor gu = backend_.empty({t, l.dense_gate_up.out_features}, DType::kF32);
  backend_.linear(h, l.dense_gate_up, gu);
  Tensor act = backend_.empty({t, l.dense_gate_up.out_features / 2}, DType::kF32);
  backend_.silu_mul(gu, act);
  backend_.linear(act, l.dense_down, out);
}

ForwardOutput DeepseekModel::forward(const ForwardBatch& batch, KvCaches& caches, bool record_routing) {
  const int64_t t = batch.num_tokens;
  const int64_t hidden = config_.hidden_size;
  DS_CHECK(t > 0 && static_cast<int64_t>(batch.token_ids.size()) == t);
  for (int32_t p : batch.positions) DS_CHECK_MSG(p >= 0 && p < max_positions_, "position " << p << " out of range");

  Tensor x = backend_.empty({t, hidden}, DType::kF32);
  backend_.embedding(weights_.embed, batch.token_ids, x);
  Tensor h = backend_.empty({t, hidden}, DType::kF32);
  Tensor y = backend_.empty({t, hidden}, DType::kF32);
  ForwardOutput result;
  for (size_t i = 0; i < weights_.layers.size(); ++i) {
    const LayerWeights& l = weights_.layers[i];
    backend_.rms_norm(x, l.input_norm, static_cast<float>(config_.rms_norm_eps), h);
    attention(l, h, batch, caches.layers[i], caches.block_size, y);
    backend_.add(x, y);
    backend_.rms_norm(x, l.post_attn_norm, static_cast<float>(config_.rms_norm_eps), h);
    MoeRouting routing;
    mlp(l, h, y, record_routing && l.is_moe ? &routing : nullptr);
    if (record_routing && l.is_moe) result.routing.push_back(std::move(routing));
    backend_.add(x, y);
  }
  const int64_t num_out = batch.logits_indices.size();
  if (num_out == 0) return result;
  Tensor sel = backend_.empty({num_out, hidden}, DType::kF32);
  backend_.gather_rows(x, batch.logits_indices, sel);
  result.hidden = backend_.empty({num_out, hidden}, DType::kF32);
  backend_.rms_norm(sel, weights_.final_norm, static_cast<float>(config_.rms_norm_eps), result.hidden);
  result.logits = backend_.empty({num_out, config_.vocab_size}, DType::kF32);
  backend_.linear(result.hidden, weights_.lm_head, result.logits);
  return result;
}

std::unique_ptr<DeepseekModel> load_deepseek_model(const std::string& model_dir, Backend& backend, int max_positions,
                                                   bool print_progress) {
  ModelConfig config = ModelConfig::load(model_dir);
  std::unique_ptr<Checkpoint> ckpt;
  if (print_progress) {
    LoadProgressPrinter printer;
    ckpt = Checkpoint::open(model_dir, [&printer](size_t done, size_t total) { printer(done, total); });
  } else {
    ckpt = Checkpoint::open(model_dir);
  }
  ModelWeights weights = load_model_weights(config, *ckpt, backend);
  return std::make_unique<DeepseekModel>(std::move(config), std::move(weights), backend, max_positions);
}

}  // namespace dsinfer
