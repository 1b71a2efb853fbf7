#include "engine/kv_cache_sizing.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/logging.h"

namespace dsinfer {
namespace {

std::string gib(int64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << static_cast<double>(bytes) / (1 << 30) << " GiB";
  return os.str();
}

// The scheduler's largest step: one prompt of its whole token budget, with logits wanted for
// the last rows, as many as requests may run at once (a decode step's LM head at full batch).
// Returns its number of tokens.
int run_largest_step(DeepseekModel& model, const EngineConfig& config, int max_model_len) {
  const int num_tokens = std::max(1, std::min(config.max_num_batched_tokens, max_model_len));
  const int block_size = config.block_size_tokens;
  const int num_blocks = (num_tokens + block_size - 1) / block_size;
  KvCaches caches = model.allocate_caches(num_blocks, block_size, config.kv_cache_format);
  ForwardBatch batch;
  batch.num_tokens = num_tokens;
  const int vocab = model.config().vocab_size;
  for (int i = 0; i < num_tokens; ++i) {
    // Spread over the vocabulary so that the routed experts get a spread of tokens.
    batch.token_ids.push_back(static_cast<TokenId>((static_cast<int64_t>(i) * 7919) % vocab));
    batch.positions.push_back(i);
    batch.slot_mapping.push_back(i);
    batch.token_seq.push_back(0);
  }
  std::vector<int32_t> table(num_blocks);
  for (int b = 0; b < num_blocks; ++b) table[b] = b;
  batch.block_tables.push_back(std::move(table));
  batch.context_lens.push_back(num_tokens);
  const int num_logit_rows = std::min(num_tokens, config.max_num_seqs);
  for (int r = num_tokens - num_logit_rows; r < num_tokens; ++r) batch.logits_indices.push_back(r);
  model.forward(batch, caches);
  return num_tokens;
}

}  // namespace

std::optional<int> kv_blocks_for_device_memory(DeepseekModel& model, Backend& backend, const EngineConfig& config,
                                               int max_model_len) {
  const std::optional<Backend::DeviceMemory> before = backend.device_memory();
  if (!before) return std::nullopt;
  const int step_tokens = run_largest_step(model, config, max_model_len);  // its cache is freed on return
  const Backend::DeviceMemory after = *backend.device_memory();
  const int64_t total = after.total_bytes;
  const int64_t in_use = total - after.free_bytes;  // weights, the step's activations, the runtime
  const int64_t share = static_cast<int64_t>(std::floor(config.device_memory_fraction * static_cast<double>(total)));
  const int64_t block_bytes =
      static_cast<int64_t>(model.kv_bytes_per_token(config.kv_cache_format)) * config.block_size_tokens;
  const int64_t kv_bytes = share - in_use;
  const int num_blocks = static_cast<int>(std::min<int64_t>(std::max<int64_t>(kv_bytes, 0) / block_bytes, 1 << 20));
  const int min_blocks = (max_model_len + config.block_size_tokens - 1) / config.block_size_tokens;
  DS_LOG_INFO("engine: KV cache of " << gib(static_cast<int64_t>(num_blocks) * block_bytes) << ": "
                                     << config.device_memory_fraction << " of the device's " << gib(total)
                                     << ", less " << gib(in_use) << " in use after a step of " << step_tokens
                                     << " tokens (" << gib(total - before->free_bytes) << " before it)");
  if (num_blocks < min_blocks)
    throw Error(StatusCode::kResourceExhausted,
                "the KV cache gets " + gib(std::max<int64_t>(kv_bytes, 0)) + " of device memory (" +
                    std::to_string(config.device_memory_fraction) + " of " + gib(total) + ", less " + gib(in_use) +
                    " in use), short of one request of the maximum length (" + std::to_string(max_model_len) +
                    " tokens, " + gib(static_cast<int64_t>(min_blocks) * block_bytes) +
                    "): raise --gpu-memory-utilization, lower --max-model-len, or use --kv-cache-dtype fp8");
  return num_blocks;
}

}  // namespace dsinfer
