// The DeepSeek V2/V3 forward pass, written once against the Backend interface.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/deepseek_weights.h"
#include "model/model_config.h"

namespace dsinfer {

// Per-layer latent caches: [num_blocks, block_size, entry] each (LayerKvCache).
struct KvCaches {
  int num_blocks = 0;
  int block_size = 64;
  std::vector<LayerKvCache> layers;
};

struct ForwardOutput {
  Tensor logits;       // [batch.logits_indices.size(), vocab]
  Tensor hidden;       // [batch.logits_indices.size(), hidden]: final-norm output at those rows
  std::vector<MoeRouting> routing;  // per MoE layer, when asked for
};

class DeepseekModel {
 public:
  DeepseekModel(ModelConfig config, ModelWeights weights, Backend& backend, int max_positions);

  const ModelConfig& config() const { return config_; }
  Backend& backend() { return backend_; }
  int max_positions() const { return max_positions_; }
  // Decode steps run as replays of recordings so far.
  int64_t num_replayed_steps() const { return num_replayed_steps_; }
  // Bytes of latent cache per token over all layers, in `format`.
  size_t kv_bytes_per_token(KvCacheFormat format = KvCacheFormat::kF32) const;

  KvCaches allocate_caches(int num_blocks, int block_size, KvCacheFormat format = KvCacheFormat::kF32);
  ForwardOutput forward(const ForwardBatch& batch, KvCaches& caches, bool record_routing = false);

 private:
  // The layer's attention output before o_proj: [T, heads * v_head_dim].
  Tensor attention(const LayerWeights& l, const Tensor& h, const ForwardBatch& batch, LayerKvCache& cache,
                   int block_size);
  void mlp(const LayerWeights& l, const Tensor& h, Tensor& out, MoeRouting* routing);
  ForwardOutput run_layers(const ForwardBatch& batch, KvCaches& caches, bool record_routing);
  // Decode steps (one token per sequence, every sequence sampled) are padded to a batch-size
  // bucket and recorded per bucket on backends that can record (Backend::pads_decode_steps);
  // 0 when the batch is not such a step.
  static int decode_bucket(const ForwardBatch& batch);
  ForwardOutput forward_recorded(const ForwardBatch& batch, KvCaches& caches, int bucket);

  // The caches a recording reads and writes: it holds their addresses, every layer's.
  struct CacheLayout {
    int num_blocks = 0, block_size = 0;
    std::vector<std::pair<const void*, KvCacheFormat>> layers;
    static CacheLayout of(const KvCaches& caches);
    bool matches(const KvCaches& caches) const;  // compared in place: every decode step asks
  };
  struct Recording {
    bool captured = false;
    bool failed = false;
    int num_eager_runs = 0;
    CacheLayout caches;    // a step over other caches records again, under the same key
    ForwardOutput output;  // the recorded step's output tensors, rewritten by each replay
  };
  std::map<uint64_t, Recording> recordings_;  // by bucket and the backend's recording_variant
  int64_t num_replayed_steps_ = 0;

  ModelConfig config_;
  ModelWeights weights_;
  Backend& backend_;
  int max_positions_;
  Tensor rope_cos_, rope_sin_;
  float softmax_scale_;
};

// Loads config + checkpoint from a directory onto the backend. Throws Error naming the file.
std::unique_ptr<DeepseekModel> load_deepseek_model(const std::string& model_dir, Backend& backend,
                                                   int max_positions = 0, bool print_progress = true);

}  // namespace dsinfer
