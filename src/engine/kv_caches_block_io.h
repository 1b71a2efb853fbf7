// KvBlockIo over the model's paged caches: one device block's bytes are the block's rows of
// every layer, layer after layer, as the backend's read_cache_block/write_cache_block give
// them (in the caches' format).
#pragma once

#include "backend/backend.h"
#include "kv/kv_block_io.h"
#include "model/deepseek_model.h"

namespace dsinfer {

class KvCachesBlockIo final : public kv::KvBlockIo {
 public:
  // The caches are attached later (the model runner allocates them after the KV manager).
  KvCachesBlockIo(Backend& backend, const ModelConfig& config, KvCacheFormat format, int block_size_tokens);
  void attach(KvCaches* caches) { caches_ = caches; }

  size_t block_bytes() const override { return layer_bytes_ * num_layers_; }
  void read_block(kv::BlockId id, std::byte* dst) override;
  void write_block(kv::BlockId id, const std::byte* src) override;

 private:
  Backend& backend_;
  KvCaches* caches_ = nullptr;
  size_t num_layers_;
  size_t layer_bytes_;  // block_size entries of latent_entry_bytes(format, ...)
};

}  // namespace dsinfer
