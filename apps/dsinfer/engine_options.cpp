#include "engine_options.h"

#include "command.h"

namespace dsinfer::cli {

void add_engine_options(CLI::App& app, EngineOptions& o) {
  app.add_option("--model", o.config.model_dir, "model directory (config.json, safetensors, tokenizer)");
  app.add_option("--backend", o.config.backend, "compute backend")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--dummy-weights", o.config.dummy_weights, "random weights of the config's shapes (benchmarks)");
  app.add_option("--kv-cache-mb", o.kv_cache_mb, "memory for the latent KV cache, MiB")->check(CLI::Range(1, 1 << 24));
  app.add_option("--num-kv-blocks", o.config.num_kv_blocks, "KV blocks (overrides --kv-cache-mb)")->check(CLI::Range(0, 1 << 24));
  app.add_option("--block-size", o.config.block_size_tokens, "tokens per KV block")->check(CLI::Range(1, 4096));
  app.add_option("--max-model-len", o.config.max_model_len, "longest prompt + output (default: the model's)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--max-batched-tokens", o.config.max_num_batched_tokens, "token budget per engine step")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-num-seqs", o.config.max_num_seqs, "requests running at once")->check(CLI::Range(1, 1 << 16));
  app.add_flag("!--no-prefix-caching", o.config.enable_prefix_caching, "disable prefix caching");
  app.add_option("--engine-seed", o.config.seed, "seed of unseeded requests' random streams");
}

EngineConfig finish_engine_options(EngineOptions& o) {
  if (o.config.model_dir.empty()) o.config.model_dir = default_model_dir();
  o.config.kv_cache_bytes = o.kv_cache_mb << 20;
  return o.config;
}

}  // namespace dsinfer::cli
