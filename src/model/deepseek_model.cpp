#include "model/deepseek_model.h"

#include <algorithm>

#include "core/check.h"
#include "core/fault_injection.h"
#include "core/logging.h"
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
  for (LayerWeights& l : weights_.layers)
    if (l.is_moe) backend_.prepare_router(l.moe, l.o_proj, l.post_attn_norm);
}

size_t DeepseekModel::kv_bytes_per_token(KvCacheFormat format) const {
  return static_cast<size_t>(config_.num_hidden_layers) *
         latent_entry_bytes(format, config_.kv_lora_rank, config_.qk_rope_head_dim);
}

KvCaches DeepseekModel::allocate_caches(int num_blocks, int block_size, KvCacheFormat format) {
  KvCaches caches;
  caches.num_blocks = num_blocks;
  caches.block_size = block_size;
  const DType dtype = latent_cache_dtype(format);
  const auto entry = static_cast<int64_t>(
      latent_entry_bytes(format, config_.kv_lora_rank, config_.qk_rope_head_dim) / dtype_size_bytes(dtype));
  for (int i = 0; i < config_.num_hidden_layers; ++i)
    caches.layers.push_back(LayerKvCache{backend_.empty({num_blocks, block_size, entry}, dtype), format});
  return caches;
}

Tensor DeepseekModel::attention(const LayerWeights& l, const Tensor& h, const ForwardBatch& batch,
                                LayerKvCache& cache, int block_size) {
  const int64_t t = h.dim(0);
  const int64_t heads = config_.num_attention_heads;
  Tensor q = backend_.empty({t, heads * config_.qk_head_dim()}, DType::kF32);
  Tensor kv_a = backend_.empty({t, config_.kv_lora_rank + config_.qk_rope_head_dim}, DType::kF32);
  if (l.has_q_lora) {
    Tensor qa = backend_.empty({t, config_.q_lora_rank}, DType::kF32);
    backend_.linear_pair(h, l.q_a, qa, l.kv_a, kv_a);
    backend_.rms_norm(qa, l.q_a_norm, kLatentNormEps, qa);
    backend_.mla_queries(qa, l.q_b, l.mla, batch, q);
  } else {
    backend_.mla_queries_and_linear(h, l.q, l.mla, batch, q, l.kv_a, kv_a);
  }
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
  return attn;
}

void DeepseekModel::mlp(const LayerWeights& l, const Tensor& h, Tensor& out, MoeRouting* routing) {
  if (l.is_moe) {
    backend_.moe(h, l.moe, out, routing);
    return;
  }
  backend_.gated_mlp(h, l.dense_gate_up, l.dense_down, out);
}

ForwardOutput DeepseekModel::forward(const ForwardBatch& batch, KvCaches& caches, bool record_routing) {
  const int64_t t = batch.num_tokens;
  DS_CHECK(t > 0 && static_cast<int64_t>(batch.token_ids.size()) == t);
  for (int32_t p : batch.positions) DS_CHECK_MSG(p >= 0 && p < max_positions_, "position " << p << " out of range");
  try {
    if (!record_routing && backend_.pads_decode_steps()) {
      const int bucket = decode_bucket(batch);
      if (bucket > 0) return forward_recorded(batch, caches, bucket);
    }
    backend_.begin_step(batch);
    ForwardOutput out = run_layers(batch, caches, record_routing);
    backend_.end_step();
    return out;
  } catch (...) {
    // A step that fails part way (out of device memory) leaves the backend ready for the next.
    backend_.abandon_step();
    throw;
  }
}

namespace {
// Eager runs of a decode bucket before it is recorded (see forward_recorded).
constexpr int kEagerRunsBeforeRecording = 2;
}  // namespace

int DeepseekModel::decode_bucket(const ForwardBatch& batch) {
  static constexpr int kBuckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256};
  const int n = batch.num_tokens;
  if (static_cast<int>(batch.block_tables.size()) != n || static_cast<int>(batch.logits_indices.size()) != n)
    return 0;
  for (int i = 0; i < n; ++i)
    if (batch.logits_indices[i] != i || batch.token_seq[i] != i || batch.block_tables[i].empty()) return 0;
  for (int b : kBuckets)
    if (b >= n) return b;
  return 0;
}

// A decode step of n sequences runs as the recording of its bucket's size and of the form the
// backend gives it (Backend::recording_variant), or padded to that size and issued eagerly
// where the backend pads without recording. Each padding sequence repeats the last real
// sequence's step (its token, position, context and block table) but stores nothing (slot -1);
// its rows are computed and ignored. Padding so shaped costs what a real sequence costs, and no
// more: one-position contexts made the attention's balanced work ranges lopsided (each such
// token costs far more than its share), and a 200-sequence step in the 224 bucket took 2.87 ms
// per three layers instead of 2.28.
ForwardOutput DeepseekModel::forward_recorded(const ForwardBatch& batch, KvCaches& caches, int bucket) {
  const int n = batch.num_tokens;
  ForwardBatch padded = batch;
  for (int i = n; i < bucket; ++i) {
    padded.token_ids.push_back(batch.token_ids[n - 1]);
    padded.positions.push_back(batch.positions[n - 1]);
    padded.slot_mapping.push_back(-1);
    padded.token_seq.push_back(i);
    padded.block_tables.push_back(batch.block_tables[n - 1]);
    padded.context_lens.push_back(batch.context_lens[n - 1]);
    padded.logits_indices.push_back(i);
  }
  padded.num_tokens = bucket;
  const uint64_t key = static_cast<uint64_t>(bucket) | uint64_t{backend_.recording_variant(padded)} << 32;
  Recording& rec = recordings_[key];
  // A recording replayed over caches other than its own would read and write the old ones (freed,
  // or another sequence set's): a step over new caches starts the bucket afresh, and its next
  // recording replaces the old one.
  if (!rec.caches.matches(caches)) {
    rec.captured = false;
    rec.failed = false;
    rec.num_eager_runs = 0;
    rec.caches = CacheLayout::of(caches);
  }
  backend_.begin_step(padded);
  ForwardOutput out;
  bool done = false;
  if (rec.captured) {
    done = backend_.replay(key);
    if (done) out = rec.output;
    rec.captured = done;  // the backend dropped it (its step buffers moved): record again
  }
  if (!done && backend_.can_record() && rec.num_eager_runs >= kEagerRunsBeforeRecording && !rec.failed) {
    try {
      backend_.begin_recording(key);
      ForwardOutput recorded = run_layers(padded, caches, false);
      if (backend_.end_recording(key) && backend_.replay(key)) {
        rec.output = std::move(recorded);
        rec.captured = true;
        out = rec.output;
        done = true;
      } else {
        rec.failed = true;
      }
    } catch (const Error& e) {
      if (e.code() != StatusCode::kResourceExhausted) throw;
      // A recording's activations are its own (they cannot be shared with eager steps): short
      // of device memory for them, the bucket runs eagerly from now on, as this step does.
      DS_LOG_WARN("decode steps of " << bucket << " rows run eagerly: recording one failed (" << e.what() << ")");
      backend_.abandon_step();
      backend_.begin_step(padded);
      rec.failed = true;
    }
  }
  if (!done) {
    // The first runs of a bucket are eager: the first builds whatever the backend makes lazily,
    // and a bucket met only once or twice (the shrinking batches at the end of a workload)
    // never pays for a recording, which costs more than an eager step.
    rec.num_eager_runs = std::min(rec.num_eager_runs + 1, kEagerRunsBeforeRecording);  // counts to the bound only
    out = run_layers(padded, caches, false);
  }
  backend_.end_step();
  if (done) ++num_replayed_steps_;
  auto first_rows = [n](Tensor t) {
    if (!t.empty()) t.shape[0] = n;
    return t;
  };
  out.logits = first_rows(out.logits);
  out.hidden = first_rows(out.hidden);
  return out;
}

DeepseekModel::CacheLayout DeepseekModel::CacheLayout::of(const KvCaches& caches) {
  CacheLayout layout{caches.num_blocks, caches.block_size, {}};
  for (const LayerKvCache& layer : caches.layers) layout.layers.emplace_back(layer.data.data, layer.format);
  return layout;
}

bool DeepseekModel::CacheLayout::matches(const KvCaches& caches) const {
  if (num_blocks != caches.num_blocks || block_size != caches.block_size || layers.size() != caches.layers.size())
    return false;
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i].first != caches.layers[i].data.data || layers[i].second != caches.layers[i].format) return false;
  return true;
}

ForwardOutput DeepseekModel::run_layers(const ForwardBatch& batch, KvCaches& caches, bool record_routing) {
  const int64_t t = batch.num_tokens;
  const int64_t hidden = config_.hidden_size;
  Tensor x = backend_.empty({t, hidden}, DType::kF32);
  backend_.embedding(weights_.embed, backend_.input_ids(batch), x);
  Tensor h = backend_.empty({t, hidden}, DType::kF32);
  Tensor y = backend_.empty({t, hidden}, DType::kF32);
  ForwardOutput result;
  // Each residual sum goes with the norm that follows it (add_rms_norm), except the last
  // layer's, whose norm runs on the logits rows only.
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const size_t num_layers = weights_.layers.size();
  if (num_layers > 0) backend_.rms_norm(x, weights_.layers[0].input_norm, eps, h);
  for (size_t i = 0; i < num_layers; ++i) {
    const LayerWeights& l = weights_.layers[i];
    if (l.is_moe && i + 1 < num_layers) backend_.will_route(l.moe, x);
    const Tensor attn = attention(l, h, batch, caches.layers[i], caches.block_size);
    backend_.linear_add_rms_norm(attn, l.o_proj, y, x, l.post_attn_norm, eps, h);
    MoeRouting routing;
    MoeRouting* recorded = record_routing && l.is_moe ? &routing : nullptr;
    if (i + 1 < num_layers && l.is_moe) {
      backend_.moe_add_rms_norm(h, l.moe, y, recorded, x, weights_.layers[i + 1].input_norm, eps, h);
    } else {
      mlp(l, h, y, recorded);
      if (i + 1 < num_layers) backend_.add_rms_norm(x, y, weights_.layers[i + 1].input_norm, eps, h);
      else backend_.add(x, y);
    }
    if (recorded != nullptr) result.routing.push_back(std::move(routing));
    if (i == 0) maybe_inject_fault("forward");
  }
  const int64_t num_out = batch.logits_indices.size();
  if (num_out == 0) return result;
  Tensor sel = backend_.empty({num_out, hidden}, DType::kF32);
  backend_.gather_rows(x, batch.logits_indices, sel);
  result.hidden = backend_.empty({num_out, hidden}, DType::kF32);
  backend_.rms_norm(sel, weights_.final_norm, eps, result.hidden);
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
