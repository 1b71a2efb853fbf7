// dsinfer bench: offline prefill and decode throughput of the model forward, next to this
// machine's memory-bandwidth floor and GEMM ceiling measured in the same run; or, with
// --workload, an offline workload through the whole engine (bench_workload.h).
//
// Decode is memory-bound: a step must read every weight it touches (attention, dense layers,
// the experts its tokens were routed to, the LM head) plus the KV of every sequence. The floor
// of a step is those bytes over the measured copy bandwidth; the ratio achieved/measured says
// how close the backend comes to it.
//
// Prefill is compute-bound: its model FLOPs (model_flops.h) over its time, as a fraction of the
// dense GEMM rate measured now, says how much of the machine the forward pass uses.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "backend/backend.h"
#include "backend/device_clocks.h"
#include "bench_report.h"
#include "bench_workload.h"
#include "command.h"
#include "core/thread_pool.h"
#include "engine_options.h"
#include "model/deepseek_model.h"
#include "model/deepseek_weights.h"
#include "model/model_flops.h"

namespace dsinfer::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Copy bandwidth (bytes read + written per second) with all threads, best of several runs.
double measure_copy_bandwidth(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  ThreadPool& pool = global_thread_pool();
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    pool.parallel_for(static_cast<int64_t>(bytes >> 20), [&](int64_t lo, int64_t hi) {
      std::memcpy(b.data() + (lo << 20), a.data() + (lo << 20), (hi - lo) << 20);
    });
    best = std::max(best, 2.0 * bytes / seconds_since(t0));
  }
  return best;
}

struct ModelBytes {
  size_t dense_per_step = 0;    // weights every step reads whatever the routing
  size_t per_expert = 0;        // one routed expert's weights
  size_t lm_head_row = 0;
  size_t kv_per_token = 0;      // all layers
};

// weight_bytes: bytes per weight element as the backend holds it (fp32 on cpu, bf16 on cuda);
// kv_per_token: the model's latent cache bytes per token in the bench's cache format.
ModelBytes model_bytes(const ModelConfig& c, size_t weight_bytes, size_t head_bytes, size_t kv_per_token) {
  const size_t f = weight_bytes;
  const size_t h = c.hidden_size, heads = c.num_attention_heads, qk = c.qk_head_dim();
  size_t attn = (c.q_lora_rank ? (h * c.q_lora_rank + c.q_lora_rank * heads * qk) : h * heads * qk) +
                h * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank * heads * (c.qk_nope_head_dim + c.v_head_dim) +
                heads * c.v_head_dim * h;
  size_t dense = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    dense += attn;
    if (c.is_moe_layer(l)) {
      dense += 3 * h * c.moe_intermediate_size * c.n_shared_experts + c.n_routed_experts * h;
    } else {
      dense += 3 * h * c.intermediate_size;
    }
  }
  ModelBytes b;
  b.dense_per_step = dense * f + static_cast<size_t>(c.vocab_size) * h * head_bytes;  // + LM head
  b.per_expert = 3 * h * c.moe_intermediate_size * f;
  b.kv_per_token = kv_per_token;
  return b;
}

struct BenchRow {
  int batch;
  double prefill_tok_s;
  double prefill_flops_per_s;
  double decode_tok_s;
  double decode_step_ms;
  double floor_step_ms;
  double achieved_gbs;
  DeviceClockSummary prefill_clocks;  // while the fastest prefill pass ran
  // 0 prefill rates: not measured (the batch's prompts did not fit one step).
  bool prefill_measured() const { return prefill_tok_s > 0; }
};

int run_bench(int argc, char** argv) {
  CLI::App app("Offline throughput of prefill and decode, with the memory-bandwidth floor", "dsinfer bench");
  std::string model_dir = std::string(DSINFER_SOURCE_DIR_FOR_BENCH) + "/bench/configs/small_v3";
  std::string backend_name = "cpu", batches_arg = "1,8,32", results_path, kv_cache_dtype = "fp32";
  std::string precision_name = "default";
  bool dummy = false, fp8 = false, prefill_only = false;
  int prompt_len = 128, decode_steps = 16, prefill_reps = 2, cached_prefix_len = 0;
  std::string workload_arg, machine = machine_description();
  // Engine limits of --workload, sized for offline throughput on a large GPU by default (the
  // budget vLLM's offline engine takes on GPUs of 70 GB or more: 16,384 tokens per step; on the
  // V2-Lite shape it gives each expert about 1,500 rows of a prefill step instead of 770). The
  // KV cache is sized to hold every running request unless given.
  EngineConfig wl;
  wl.max_num_batched_tokens = 16384;
  wl.max_num_seqs = 256;
  int64_t kv_cache_mb = 0;
  uint64_t prompt_seed = 0;
  app.add_option("--model", model_dir, "model directory (config.json; weights unless --dummy-weights)");
  app.add_flag("--dummy-weights", dummy, "random weights (default when the directory has no safetensors)");
  app.add_flag("--fp8", fp8, "random weights with the layers' projections in FP8 (e4m3, 128x128 block scales)");
  app.add_option("--backend", backend_name)->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--kv-cache-dtype", kv_cache_dtype, "latent cache entries: fp32 or fp8")
      ->check(CLI::IsMember({"fp32", "fp8"}));
  app.add_option("--precision", precision_name, "products' operands: default, or fp32 (cuda: the fp32 precision mode)")
      ->check(CLI::IsMember({"default", "fp32"}));
  app.add_option("--batch-sizes", batches_arg, "comma-separated batch sizes");
  app.add_option("--prompt-len", prompt_len, "tokens per prompt (prefill, and the decode context)")->check(CLI::Range(1, 1 << 16));
  app.add_option("--cached-prefix-len", cached_prefix_len,
                 "positions of each prompt already in the KV cache: the timed prefill computes the prompt's "
                 "--prompt-len tokens after them, as a follow-up turn over a cached conversation does")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--decode-steps", decode_steps, "timed decode steps per batch size")->check(CLI::Range(1, 1 << 16));
  app.add_option("--prefill-reps", prefill_reps, "timed prefill passes per batch size; the fastest is reported (the first warms up)")
      ->check(CLI::Range(1, 100));
  app.add_flag("--prefill-only", prefill_only, "skip the decode steps");
  app.add_option("--results", results_path, "append a markdown table to this file (e.g. bench/RESULTS.md)");
  app.add_option("--machine", machine, "machine label for the results file (default: the CPU model)");
  app.add_option("--workload", workload_arg,
                 "offline workload NUMxINxOUT through the engine: NUM requests at once, IN random prompt tokens, "
                 "exactly OUT generated tokens each (e.g. 200x1000x100)");
  app.add_option("--max-batched-tokens", wl.max_num_batched_tokens, "--workload: token budget per engine step")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-num-seqs", wl.max_num_seqs, "--workload: requests running at once")->check(CLI::Range(1, 1 << 16));
  int async_scheduling = -1;
  add_async_scheduling_options(app, async_scheduling, "decode steps and --workload: ");
  app.add_option("--num-kv-blocks", wl.num_kv_blocks, "--workload: KV blocks (default: every running request at full length)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--kv-cache-mb", kv_cache_mb, "--workload: KV cache memory, MiB (instead of --num-kv-blocks)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--block-size", wl.block_size_tokens, "--workload: tokens per KV block")->check(CLI::Range(1, 4096));
  app.add_option("--max-model-len", wl.max_model_len, "--workload: longest prompt + output (default IN + OUT)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--prompt-seed", prompt_seed, "--workload: seed of the random prompts");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::vector<int> batches;
  {
    std::stringstream ss(batches_arg);
    std::string item;
    while (std::getline(ss, item, ',')) batches.push_back(std::max(1, std::atoi(item.c_str())));
  }
  if (batches.empty()) {
    std::cerr << "error: --batch-sizes needs at least one batch size, e.g. 1,8,32\n";
    return 2;
  }
  const bool has_weights = std::filesystem::exists(model_dir + "/model.safetensors") ||
                           std::filesystem::exists(model_dir + "/model.safetensors.index.json");
  dummy = dummy || !has_weights;
  KvCacheFormat cache_format = KvCacheFormat::kF32;
  parse_kv_cache_format(kv_cache_dtype, &cache_format);  // the validator accepted it
  Precision precision = Precision::kDefault;
  parse_precision(precision_name, &precision);  // and this one
  const bool decode_ahead = async_scheduling_for(async_scheduling, backend_name);

  if (!workload_arg.empty()) {
    Result<WorkloadShape> shape = parse_workload_shape(workload_arg);
    if (!shape.ok()) {
      std::cerr << "error: " << shape.status().message() << "\n";
      return 2;
    }
    WorkloadOptions o;
    o.engine = wl;
    o.engine.model_dir = model_dir;
    o.engine.backend = backend_name;
    o.engine.async_scheduling = async_scheduling_for(async_scheduling, backend_name);
    o.engine.precision = precision;
    o.engine.dummy_weights = dummy;
    o.engine.dummy_fp8 = fp8;
    o.engine.kv_cache_format = cache_format;
    o.kv_size_given = wl.num_kv_blocks > 0 || kv_cache_mb > 0;
    if (kv_cache_mb > 0) o.engine.kv_cache_bytes = kv_cache_mb << 20;
    o.shape = *shape;
    o.prompt_seed = prompt_seed;
    o.results_path = results_path;
    o.command = command_line(argc, argv);
    o.machine = machine;
    return run_workload(std::move(o));
  }

  std::unique_ptr<Backend> backend;
  try {
    backend = make_backend(backend_name, precision);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  // The GPU's clocks while the ceiling and each timed prefill run: a rate and a ceiling measured
  // at different clocks would not compare like with like.
  std::unique_ptr<DeviceClockSampler> clocks;
  if (backend_name == "cuda") clocks = std::make_unique<DeviceClockSampler>();
  auto start_clocks = [&] {
    if (clocks) clocks->start();
  };
  auto stop_clocks = [&] { return clocks ? clocks->stop() : DeviceClockSummary{}; };
  // The GEMM ceiling first, while the device's memory is free of the model.
  start_clocks();
  const double gemm_flops = measure_device_gemm_flops(backend_name, fp8);
  const DeviceClockSummary ceiling_clocks = stop_clocks();
  std::cerr << "GEMM ceiling: " << gemm_flops / 1e12 << " TFLOP/s\n";
  // The same product back to back for about as long as a 4 × 4k prefill pass: the clocks a pass
  // of that length gets under the power limit, which the ceiling's short groups do not meet.
  constexpr double kSustainedWindowS = 0.2;
  double sustained_gemm_flops = 0;
  DeviceClockSummary sustained_clocks;
  if (backend_name == "cuda") {
    start_clocks();
    sustained_gemm_flops = measure_device_gemm_flops(backend_name, fp8, kSustainedWindowS);
    sustained_clocks = stop_clocks();
    std::cerr << "sustained GEMM rate: " << sustained_gemm_flops / 1e12 << " TFLOP/s\n";
  }
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  // + warm-up steps and the routed step
  const int max_positions = cached_prefix_len + prompt_len + decode_steps + 4;
  std::unique_ptr<DeepseekModel> model;
  const auto load_start = Clock::now();
  try {
    if (dummy) {
      ModelConfig config = ModelConfig::load(model_dir);
      model = std::make_unique<DeepseekModel>(config, make_random_weights(config, *backend, 7, fp8), *backend,
                                              max_positions);
    } else {
      model = load_deepseek_model(model_dir, *backend, max_positions);
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "model ready in " << seconds_since(load_start) << " s\n";
  const ModelConfig& c = model->config();
  const bool on_device = backend_name == "cuda";
  // With --fp8 the layers' projections are e4m3 on the device (1 byte), the LM head bf16.
  const size_t head_bytes = on_device ? 2 : sizeof(float);
  const ModelBytes mb = model_bytes(c, on_device ? (fp8 ? 1 : 2) : sizeof(float), head_bytes,
                                    model->kv_bytes_per_token(cache_format));
  // The ceiling is the copy bandwidth of the memory the weights live in: device-to-device
  // cudaMemcpy for cuda, a threaded host memcpy for cpu.
  // Decode's ceiling only: --prefill-only skips it (a host measurement touches 2 GiB).
  double copy_bw = 0;
  if (!prefill_only) {
    copy_bw = on_device ? measure_device_copy_bandwidth(backend_name) : measure_copy_bandwidth(size_t{1} << 30);
    std::cerr << "copy bandwidth (read+write): " << copy_bw / 1e9 << " GB/s\n";
  }
  // Each step ends with its logits on the host, as the engine needs them: that also waits for
  // a device backend's queued work, so the clock measures the whole step.
  std::vector<float> logits_host;
  auto fetch_logits = [&](const ForwardOutput& out) {
    logits_host.resize(out.logits.num_elements());
    if (!out.logits.empty()) backend->to_host(out.logits, logits_host.data());
  };

  const int bs = 64;
  const int blocks_per_seq = (max_positions + bs - 1) / bs;
  KvCaches caches = model->allocate_caches(blocks_per_seq * max_batch, bs, cache_format);
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> tok(2, c.vocab_size - 1);

  std::vector<BenchRow> rows;
  for (int batch : batches) {
    // Prefill: `batch` prompts of prompt_len tokens in one forward pass, after their cached
    // prefixes of cached_prefix_len positions.
    std::vector<std::vector<int32_t>> tables(batch, std::vector<int32_t>(blocks_per_seq));
    for (int s = 0; s < batch; ++s) std::iota(tables[s].begin(), tables[s].end(), s * blocks_per_seq);
    // Positions [first, first + len) of every sequence, in one step.
    auto chunk_batch = [&](int first, int len) {
      ForwardBatch b;
      for (int s = 0; s < batch; ++s) {
        for (int p = first; p < first + len; ++p) {
          b.token_ids.push_back(tok(rng));
          b.positions.push_back(p);
          b.slot_mapping.push_back(tables[s][p / bs] * bs + p % bs);
          b.token_seq.push_back(s);
        }
        b.block_tables.push_back(tables[s]);
        b.context_lens.push_back(first + len);
        b.logits_indices.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
      }
      b.num_tokens = static_cast<int>(b.token_ids.size());
      return b;
    };
    // Positions [first, end) of every sequence, untimed, in steps of at most kPrefixStepTokens
    // tokens in all.
    constexpr int kPrefixStepTokens = 16384;
    const int prefix_chunk = std::max(1, kPrefixStepTokens / batch);
    auto write_in_steps = [&](int first, int end) {
      for (; first < end; first += prefix_chunk)
        fetch_logits(model->forward(chunk_batch(first, std::min(prefix_chunk, end - first)), caches));
    };
    write_in_steps(0, cached_prefix_len);  // the prefixes
    const ForwardBatch fb = chunk_batch(cached_prefix_len, prompt_len);
    // The same prefill again rewrites the same cache slots with the same values; the fastest
    // pass leaves out one-time costs (plans, allocations, clocks ramping up).
    double prefill_s = 0;
    DeviceClockSummary prefill_clocks;
    try {
      for (int rep = 0; rep < prefill_reps; ++rep) {
        start_clocks();
        const auto t0 = Clock::now();
        fetch_logits(model->forward(fb, caches));
        const double dt = seconds_since(t0);
        const DeviceClockSummary rep_clocks = stop_clocks();
        if (rep == 0 || dt < prefill_s) prefill_clocks = rep_clocks;
        prefill_s = rep == 0 ? dt : std::min(prefill_s, dt);
      }
    } catch (const Error& e) {
      // Every prompt in one step may not fit the device (256 prompts of 1k tokens beside bf16
      // weights on an 80 GB GPU): the prefill is then not measured, and the prompts are written
      // in steps as the prefixes are, which is all the decode figures need.
      if (e.code() != StatusCode::kResourceExhausted || prefill_only) throw;
      stop_clocks();
      std::cerr << "batch " << batch << ": " << fb.num_tokens << " prompt tokens in one step do not fit ("
                << e.what() << "); prefill not measured, the prompts written in steps of up to "
                << prefix_chunk * batch << " tokens\n";
      prefill_s = 0;
      prefill_clocks = {};
      write_in_steps(cached_prefix_len, cached_prefix_len + prompt_len);
    }
    const double prefill_flops = prefill_step_flops(c, batch, prompt_len, cached_prefix_len);
    if (prefill_only) {
      BenchRow row{};
      row.batch = batch;
      row.prefill_tok_s = batch * prompt_len / prefill_s;
      row.prefill_flops_per_s = prefill_flops / prefill_s;
      row.prefill_clocks = prefill_clocks;
      rows.push_back(row);
      std::cerr << "batch " << batch << ": prefill " << row.prefill_tok_s << " tok/s, "
                << row.prefill_flops_per_s / 1e12 << " TFLOP/s\n";
      continue;
    }

    // Decode: one token per sequence per step, contexts growing from prompt_len. One step ahead
    // (the engine's default on the cuda backend), each step is launched before the step before it
    // is finished, with that step's greedy choices as its tokens (placeholders the backend fills
    // on the device, as the engine's are), so the device runs the steps back to back as it does
    // when serving, and a step's time runs from the host receiving one step's tokens to the next.
    // One at a time, each step is launched, run and its tokens fetched before the next.
    double decode_s = 0, floor_s = 0, bytes_total = 0;
    size_t expert_bytes = 0;
    std::vector<size_t> step_bytes;
    std::vector<int32_t> greedy_ids;
    const std::vector<RowSampling> greedy_rows(static_cast<size_t>(batch));  // every row greedy
    uint64_t in_flight = 0;  // the ticket of the step launched ahead, 0 when none
    auto finish_in_flight = [&] {
      if (in_flight != 0) backend->wait_choice(in_flight);
      in_flight = 0;
      return Clock::now();
    };
    constexpr int kWarmupSteps = 3;
    const int last_step = decode_steps + kWarmupSteps;  // untimed, routed
    Clock::time_point timed_from;
    for (int step = 0; step <= last_step; ++step) {
      // The first steps are warm-up (a device backend records its decode step on the third);
      // the last one is untimed and records the routing, which sets how many experts a step
      // reads (recording it would make the timed steps wait for the host). It runs once the
      // steps before it are finished, one at a time.
      const bool routed = step == last_step;
      ForwardBatch db;
      for (int s = 0; s < batch; ++s) {
        const int pos = cached_prefix_len + prompt_len + step;
        const auto& table = tables[s];
        db.token_ids.push_back(decode_ahead && !routed && step > 0 ? -1 - s : tok(rng));
        db.positions.push_back(pos);
        db.slot_mapping.push_back(table[pos / bs] * bs + pos % bs);
        db.token_seq.push_back(s);
        db.block_tables.push_back(table);
        db.context_lens.push_back(pos + 1);
        db.logits_indices.push_back(s);
      }
      db.num_tokens = batch;
      if (step >= kWarmupSteps && !routed) {
        step_bytes.push_back(mb.dense_per_step +
                             static_cast<size_t>(batch) * (cached_prefix_len + prompt_len + step + 1) *
                                 mb.kv_per_token);
      }
      if (decode_ahead && !routed) {
        ForwardOutput out = model->forward(db, caches);
        const uint64_t ticket = backend->choose_async(out.logits, greedy_rows);
        const Clock::time_point done = finish_in_flight();  // the step before this one
        in_flight = ticket;
        if (step == kWarmupSteps) timed_from = done;
        continue;
      }
      const Clock::time_point drained = finish_in_flight();
      if (decode_ahead) decode_s = std::chrono::duration<double>(drained - timed_from).count();
      const auto t0 = Clock::now();
      ForwardOutput out = model->forward(db, caches, routed);
      backend->argmax_rows(out.logits, greedy_ids);  // as the engine does for greedy requests
      const double dt = seconds_since(t0);
      if (routed) {
        for (const MoeRouting& r : out.routing) {
          std::set<int32_t> distinct(r.expert_ids.begin(), r.expert_ids.end());
          expert_bytes += distinct.size() * mb.per_expert;
        }
      }
      if (step >= kWarmupSteps && !routed) decode_s += dt;
    }
    for (size_t b : step_bytes) {
      bytes_total += b + expert_bytes;
      floor_s += (b + expert_bytes) / copy_bw;
    }
    BenchRow row;
    row.batch = batch;
    row.prefill_tok_s = prefill_s > 0 ? batch * prompt_len / prefill_s : 0;  // 0: not measured
    row.prefill_flops_per_s = prefill_s > 0 ? prefill_flops / prefill_s : 0;
    row.decode_tok_s = batch * decode_steps / decode_s;
    row.decode_step_ms = 1e3 * decode_s / decode_steps;
    row.floor_step_ms = 1e3 * floor_s / decode_steps;
    row.achieved_gbs = bytes_total / decode_s / 1e9;
    row.prefill_clocks = prefill_clocks;
    rows.push_back(row);
    std::cerr << "batch " << batch << ": prefill ";
    if (row.prefill_measured())
      std::cerr << row.prefill_tok_s << " tok/s, " << row.prefill_flops_per_s / 1e12 << " TFLOP/s";
    else
      std::cerr << "not measured";
    std::cerr << ", decode " << row.decode_tok_s
              << " tok/s, step " << row.decode_step_ms << " ms (floor " << row.floor_step_ms << " ms)\n";
  }

  auto ratio_to = [](double flops_per_s, double ceiling) {
    char text[32] = "n/a";  // also for a prefill not measured (0)
    if (ceiling > 0 && flops_per_s > 0) std::snprintf(text, sizeof text, "%.1f%%", 100.0 * flops_per_s / ceiling);
    return std::string(text);
  };
  auto gemm_ratio = [&](double flops_per_s) { return ratio_to(flops_per_s, gemm_flops); };
  std::ostringstream table;
  if (prefill_only) {
    table << "| batch | prefill tok/s | prefill TFLOP/s | of GEMM ceiling | prefill ms |\n|---:|---:|---:|---:|---:|\n";
  } else {
    table << "| batch | prefill tok/s | prefill TFLOP/s | of GEMM ceiling | decode tok/s | decode step ms "
             "| bandwidth floor ms | achieved GB/s | of copy bw |\n"
          << "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  }
  for (const auto& r : rows) {
    char line[320];
    if (prefill_only) {
      std::snprintf(line, sizeof line, "| %d | %.0f | %.4g | %s | %.2f |\n", r.batch, r.prefill_tok_s,
                    r.prefill_flops_per_s / 1e12, gemm_ratio(r.prefill_flops_per_s).c_str(),
                    1e3 * r.batch * prompt_len / r.prefill_tok_s);
    } else {
      char prefill[64] = "n/a | n/a";  // not measured: the prompts did not fit one step
      if (r.prefill_measured())
        std::snprintf(prefill, sizeof prefill, "%.0f | %.4g", r.prefill_tok_s, r.prefill_flops_per_s / 1e12);
      std::snprintf(line, sizeof line, "| %d | %s | %s | %.1f | %.2f | %.2f | %.1f | %.0f%% |\n", r.batch, prefill,
                    gemm_ratio(r.prefill_flops_per_s).c_str(), r.decode_tok_s, r.decode_step_ms, r.floor_step_ms,
                    r.achieved_gbs, 100.0 * r.floor_step_ms / r.decode_step_ms);
    }
    table << line;
  }
  std::ostringstream header;
  header << "### dsinfer bench — " << c.architecture << " " << (dummy ? "(random weights) " : "") << "hidden "
         << c.hidden_size << ", " << c.num_hidden_layers << " layers, " << c.n_routed_experts << " experts top-"
         << c.num_experts_per_tok << ", backend " << backend->name() << "\n\n"
         << "- date: " << utc_timestamp() << "\n- machine: " << machine << "\n"
         << "- command: `" << command_line(argc, argv) << "`\n"
         << "- latent cache: " << kv_cache_format_name(cache_format) << "\n"
         << (precision == Precision::kFp32
                 ? "- precision: fp32 (weights held in fp32; the floor below counts the default path's bytes)\n"
                 : "")
         << "- measured "
         << (prefill_only ? ""
                          : std::string("copy bandwidth (read+write, ") +
                                (on_device ? "device-to-device cudaMemcpy" : "all threads") +
                                "): " + std::to_string(copy_bw / 1e9) + " GB/s; ")
         << "GEMM ceiling ("
         << (!on_device ? "the CPU backend's fp32 matmul, 512x2048x2048, all threads"
             : fp8    ? "cuBLASLt block-scaled FP8 8192x8192x8192, 1x128 x 128x128 scales"
                      : "cuBLASLt bf16 8192x8192x8192")
         << "): " << gemm_flops / 1e12 << " TFLOP/s\n"
         << "- prefill: " << prompt_len << "-token prompts"
         << (cached_prefix_len > 0 ? " after cached prefixes of " + std::to_string(cached_prefix_len) + " positions" : "")
         << ", all of a batch in one step, fastest of " << prefill_reps
         << " passes; TFLOP/s counts 2 x activated weights per token + causal attention (model_flops.h)"
         << (prefill_only ? ""
                          : "; decode contexts start at " + std::to_string(cached_prefix_len + prompt_len) + " tokens")
         << "\n";
  if (!prefill_only) {
    header << (decode_ahead ? "- decode steps: one ahead, as the engine schedules them (each launched before the step "
                              "before it is finished, its tokens that step's greedy choices)\n"
                            : "- decode steps: one at a time (each finished and its tokens fetched before the next)\n");
  }
  if (clocks && !clocks->available()) {
    header << "- SM clock: not sampled (" << clocks->unavailable_reason() << ")\n";
  } else if (clocks) {
    header << "- SM clock (NVML, every 2 ms): GEMM ceiling " << ceiling_clocks.describe();
    for (const auto& r : rows)
      if (r.prefill_measured()) header << "; prefill at batch " << r.batch << " " << r.prefill_clocks.describe();
    header << "\n";
  }
  if (sustained_gemm_flops > 0) {
    header << "- sustained GEMM rate (the ceiling's product back to back for " << kSustainedWindowS
           << " s, over the whole window): " << sustained_gemm_flops / 1e12 << " TFLOP/s";
    if (clocks && clocks->available()) header << ", SM clock " << sustained_clocks.describe();
    for (const auto& r : rows)
      if (r.prefill_measured())
        header << "; prefill at batch " << r.batch << ": " << ratio_to(r.prefill_flops_per_s, sustained_gemm_flops)
               << " of it";
    header << "\n";
  }
  header << "\n";
  std::cout << header.str() << table.str();
  if (!results_path.empty() && !append_results(results_path, header.str() + table.str())) {
    std::cerr << "error: cannot append to " << results_path << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

DSINFER_REGISTER_COMMAND(bench, "bench",
                         "offline prefill/decode throughput vs the GEMM ceiling and bandwidth floor; --workload",
                         run_bench);

}  // namespace dsinfer::cli
