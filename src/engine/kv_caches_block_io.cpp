#include "engine/kv_caches_block_io.h"

#include "core/check.h"

namespace dsinfer {

KvCachesBlockIo::KvCachesBlockIo(Backend& backend, const ModelConfig& config, KvCacheFormat format,
                                 int block_size_tokens)
    : backend_(backend),
      num_layers_(static_cast<size_t>(config.num_hidden_layers)),
      layer_bytes_(static_cast<size_t>(block_size_tokens) *
                   latent_entry_bytes(format, config.kv_lora_rank, config.qk_rope_head_dim)) {}

void KvCachesBlockIo::read_block(kv::BlockId id, std::byte* dst) {
  DS_CHECK(caches_ != nullptr && caches_->layers.size() == num_layers_);
  for (size_t l = 0; l < num_layers_; ++l)
    backend_.read_cache_block(caches_->layers[l], id, dst + l * layer_bytes_);
}

void KvCachesBlockIo::write_block(kv::BlockId id, const std::byte* src) {
  DS_CHECK(caches_ != nullptr && caches_->layers.size() == num_layers_);
  for (size_t l = 0; l < num_layers_; ++l)
    backend_.write_cache_block(caches_->layers[l], id, src + l * layer_bytes_);
}

}  // namespace dsinfer
