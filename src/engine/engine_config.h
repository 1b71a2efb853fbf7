// How an engine is built: model, backend, memory for the KV cache, scheduling limits.
#pragma once

#include <cstdint>
#include <string>

#include "backend/latent_cache_format.h"
#include "backend/precision.h"
#include "kv/kv_tier_options.h"

namespace dsinfer {

struct EngineConfig {
  std::string model_dir;
  std::string backend = "cpu";
  Precision precision = Precision::kDefault;  // kFp32: the CUDA backend's fp32 precision mode
  bool dummy_weights = false;       // random weights of the config's shapes (benchmarks)
  bool dummy_fp8 = false;           // with dummy_weights: the layers' projections in FP8, as V3 ships them
  int block_size_tokens = 64;
  int64_t kv_cache_bytes = int64_t{1} << 30;  // device (here: host) memory for latent KV
  // How the latent cache stores a position: fp32, or DeepSeek's FP8 entry (3.5x more tokens in
  // the same memory, at FP8's precision for the latent part).
  KvCacheFormat kv_cache_format = KvCacheFormat::kF32;
  int num_kv_blocks = 0;            // overrides kv_cache_bytes when > 0
  // > 0 (and num_kv_blocks not given): the KV cache takes what is left of this share of the
  // device's memory after the weights and the largest step's activations (kv_cache_sizing.h),
  // in place of kv_cache_bytes; backends without device memory keep kv_cache_bytes.
  double device_memory_fraction = 0;
  int max_model_len = 0;            // 0: the model's max_position_embeddings
  int max_num_batched_tokens = 2048;
  int max_num_seqs = 256;
  int max_queued_requests = 4096;
  bool enable_prefix_caching = true;
  // Schedule and launch step N+1 before waiting for step N's tokens, so that the device never
  // waits on the host between steps. A request that stops at step N (eos, a stop token) has
  // one more row computed in step N+1, which is dropped. The command line turns it on by
  // default for the cuda backend (--no-async-scheduling turns it off).
  bool async_scheduling = false;
  uint64_t seed = 0;                // base of the random streams of unseeded requests
  bool print_load_progress = true;
  kv::KvTierOptions kv_tiers;       // host tier and block store (both off by default)
};

}  // namespace dsinfer
