#include "engine_options.h"

#include "command.h"
#include "kv/kv_tier_options.h"

namespace dsinfer::cli {
namespace {

std::string check_size(const std::string& v) {
  auto r = kv::parse_byte_size(v);
  return r.ok() ? std::string() : r.status().message();
}

std::string check_duration(const std::string& v) {
  auto r = kv::parse_duration_ms(v);
  return r.ok() ? std::string() : r.status().message();
}

}  // namespace

void add_engine_options(CLI::App& app, EngineOptions& o) {
  app.add_option("--model", o.config.model_dir, "model directory (config.json, safetensors, tokenizer)");
  app.add_option("--backend", o.config.backend, "compute backend")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--dummy-weights", o.config.dummy_weights, "random weights of the config's shapes (benchmarks)");
  CLI::Option* kv_mb = app.add_option("--kv-cache-mb", o.kv_cache_mb,
                                      "memory for the latent KV cache, MiB (default: cpu 1024; cuda: see "
                                      "--gpu-memory-utilization)")
                          ->check(CLI::Range(1, 1 << 24));
  app.add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                 "cuda: share of the GPU's memory for weights, activations and the KV cache, which takes what "
                 "the weights and the largest step leave (default 0.9)")
      ->check(CLI::Range(0.05, 1.0))
      ->excludes(kv_mb);
  app.add_option("--kv-cache-dtype", o.kv_cache_dtype,
                 "latent cache entries: fp32, or fp8 (e4m3 latent with a scale per 128 columns, bf16 rope; 3.5x "
                 "the tokens in the same memory)")
      ->check(CLI::IsMember({"fp32", "fp8"}));
  app.add_option("--precision", o.precision,
                 "products' operands: default (cuda: bf16, FP8 activations for FP8 weights in prefill), or fp32 "
                 "(cuda: fp32 weights and products, for checking at reference precision; cpu: always fp32)")
      ->check(CLI::IsMember({"default", "fp32"}));
  app.add_option("--num-kv-blocks", o.config.num_kv_blocks,
                 "KV blocks (overrides --kv-cache-mb and --gpu-memory-utilization)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--block-size", o.config.block_size_tokens, "tokens per KV block")->check(CLI::Range(1, 4096));
  app.add_option("--max-model-len", o.config.max_model_len, "longest prompt + output (default: the model's)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--max-batched-tokens", o.config.max_num_batched_tokens, "token budget per engine step")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-num-seqs", o.config.max_num_seqs, "requests running at once")->check(CLI::Range(1, 1 << 16));
  app.add_flag("!--no-prefix-caching", o.config.enable_prefix_caching, "disable prefix caching");
  add_async_scheduling_options(app, o.async_scheduling, "");
  app.add_option("--engine-seed", o.config.seed, "seed of unseeded requests' random streams");
  app.add_option("--kv-store", o.kv_store_dir,
                 "use a KV block store in DIR, local or a shared POSIX mount (serve: on by default in ~/.cache/dsinfer/kv)");
  app.add_flag("--no-kv-store", o.no_kv_store, "no KV block store");
  app.add_option("--kv-store-capacity", o.kv_store_capacity, "bound on the block store, e.g. 200G")
      ->check(CLI::Validator(check_size, "SIZE"));
  app.add_option("--kv-host-cache", o.kv_host_cache, "host memory for KV blocks evicted from the device, e.g. 8G")
      ->check(CLI::Validator(check_size, "SIZE"));
  app.add_option("--kv-ttl-agent", o.kv_ttl_agent, "block store retention of agent traffic (default 3d)")
      ->check(CLI::Validator(check_duration, "DURATION"));
  app.add_option("--kv-ttl-chat", o.kv_ttl_chat, "block store retention of chat traffic (default 7d)")
      ->check(CLI::Validator(check_duration, "DURATION"));
}

void add_async_scheduling_options(CLI::App& app, int& choice, const std::string& scope) {
  CLI::Option* on = app.add_flag_callback(
      "--async-scheduling", [&choice] { choice = 1; },
      scope + "launch each engine step before the previous one's tokens are back, so that the device never waits "
              "on the scheduler (a request that stops computes one extra row); the default on the cuda backend");
  CLI::Option* off = app.add_flag_callback(
      "--no-async-scheduling", [&choice] { choice = 0; },
      scope + "finish each engine step before scheduling the next (the default on the cpu backend)");
  on->excludes(off);
}

bool async_scheduling_for(int choice, const std::string& backend) {
  return choice < 0 ? backend == "cuda" : choice == 1;
}

EngineConfig finish_engine_options(EngineOptions& o) {
  if (o.config.model_dir.empty()) o.config.model_dir = default_model_dir();
  if (o.kv_cache_mb > 0) o.config.kv_cache_bytes = o.kv_cache_mb << 20;
  else if (o.config.backend == "cuda") o.config.device_memory_fraction = o.gpu_memory_utilization;
  o.config.async_scheduling = async_scheduling_for(o.async_scheduling, o.config.backend);
  parse_kv_cache_format(o.kv_cache_dtype, &o.config.kv_cache_format);  // the validator accepted it
  parse_precision(o.precision, &o.config.precision);                  // and this one
  kv::KvTierOptions& t = o.config.kv_tiers;
  t.store_enabled = !o.no_kv_store && (o.kv_store_by_default || !o.kv_store_dir.empty());
  t.store_directory = o.kv_store_dir;
  // The validators above have accepted these strings.
  if (!o.kv_store_capacity.empty()) t.store_capacity_bytes = kv::parse_byte_size(o.kv_store_capacity).value();
  if (!o.kv_host_cache.empty()) t.host_cache_bytes = kv::parse_byte_size(o.kv_host_cache).value();
  if (!o.kv_ttl_agent.empty()) t.ttl_agent_ms = kv::parse_duration_ms(o.kv_ttl_agent).value();
  if (!o.kv_ttl_chat.empty()) t.ttl_chat_ms = kv::parse_duration_ms(o.kv_ttl_chat).value();
  return o.config;
}

}  // namespace dsinfer::cli
