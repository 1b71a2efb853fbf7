#include "bench_workload.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <vector>

#include "backend/backend.h"
#include "bench_report.h"
#include "engine/engine_core.h"
#include "model/model_flops.h"

namespace dsinfer::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Nearest-rank percentile of an already sorted, non-empty sample.
double percentile(const std::vector<double>& sorted, double pct) {
  const size_t rank = static_cast<size_t>(std::ceil(pct / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

// Token ids a real prompt could hold: DeepSeek tokenizers put bos/eos either at the very start
// of the vocabulary (V3: 0, 1) or where the special tokens begin near its end (V2: 100000+), so
// draw above the low ones and below the high ones.
std::pair<TokenId, TokenId> ordinary_token_range(const ModelConfig& c) {
  TokenId lo = 0, hi = c.vocab_size;  // [lo, hi)
  std::vector<int> specials = c.eos_token_ids;
  specials.push_back(c.bos_token_id);
  for (int s : specials) {
    if (s < 0 || s >= c.vocab_size) continue;
    if (s < c.vocab_size / 2) {
      lo = std::max(lo, s + 1);
    } else {
      hi = std::min(hi, s);
    }
  }
  if (hi <= lo) return {0, c.vocab_size};  // a degenerate config: any id will do
  return {lo, hi};
}

// Model FLOPs of one request: its prompt in one prefill (one logits row), then OUT - 1 decode
// steps whose contexts grow from IN + 1. Chunked prefill adds no FLOPs by this count; preemption
// recompute does, and is not counted.
double request_flops(const ModelConfig& c, const WorkloadShape& w) {
  double f = chunk_flops(c, 0, w.prompt_len_tokens, 1);
  for (int j = 1; j < w.output_len_tokens; ++j) f += chunk_flops(c, w.prompt_len_tokens + j - 1, 1, 1);
  return f;
}

}  // namespace

Result<WorkloadShape> parse_workload_shape(const std::string& text) {
  int fields[3] = {0, 0, 0};
  const char* p = text.data();
  const char* end = text.data() + text.size();
  for (int i = 0; i < 3; ++i) {
    if (i > 0) {
      if (p == end || (*p != 'x' && *p != 'X'))
        return invalid_argument("--workload '" + text + "': expected NUMxINxOUT, e.g. 200x1000x100");
      ++p;
    }
    const auto [next, ec] = std::from_chars(p, end, fields[i]);
    if (ec != std::errc() || fields[i] <= 0)
      return invalid_argument("--workload '" + text + "': NUM, IN and OUT must be positive integers (NUMxINxOUT)");
    p = next;
  }
  if (p != end) return invalid_argument("--workload '" + text + "': trailing characters after NUMxINxOUT");
  return WorkloadShape{fields[0], fields[1], fields[2]};
}

int run_workload(WorkloadOptions o) {
  const WorkloadShape w = o.shape;
  EngineConfig& cfg = o.engine;
  const int total_len = w.prompt_len_tokens + w.output_len_tokens;
  if (cfg.max_model_len <= 0) cfg.max_model_len = total_len;
  if (!o.kv_size_given) {
    // Room for every request that can run at once at its full length: no preemption from a
    // KV cache that is merely too small by default.
    const int64_t blocks_per_request = (total_len + cfg.block_size_tokens - 1) / cfg.block_size_tokens;
    const int64_t running = std::min(w.num_requests, cfg.max_num_seqs);
    cfg.num_kv_blocks = static_cast<int>(std::min<int64_t>(running * blocks_per_request + 1, 1 << 24));
  }
  cfg.max_queued_requests = std::max(cfg.max_queued_requests, w.num_requests);

  // The ceiling first, while the device's memory is still free.
  const double gemm_flops = measure_device_gemm_flops(cfg.backend, cfg.dummy_fp8);
  std::unique_ptr<EngineCore> engine;
  try {
    engine = std::make_unique<EngineCore>(cfg);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  const ModelConfig& mc = engine->model_config();

  std::vector<GenerationRequest> requests(w.num_requests);
  {
    std::mt19937_64 rng(o.prompt_seed);
    const auto [lo, hi] = ordinary_token_range(mc);
    std::uniform_int_distribution<TokenId> token(lo, hi - 1);
    for (GenerationRequest& r : requests) {
      r.prompt_ids.resize(w.prompt_len_tokens);
      for (TokenId& t : r.prompt_ids) t = token(rng);
      r.sampling.temperature = 0.0f;
      r.sampling.max_tokens = w.output_len_tokens;
      r.sampling.ignore_eos = true;
    }
  }

  struct Progress {
    int num_tokens = 0;
    std::optional<double> ttft_s;
    FinishReason finish = FinishReason::kNone;
  };
  std::vector<Progress> progress(w.num_requests);

  // One request of the same prompt length first, off the clock: the first step of a backend
  // pays one-time costs (device context, matmul plans, allocator growth) that a serving engine
  // pays once at start-up, not per workload. Its prompt is drawn apart from the measured ones.
  {
    GenerationRequest warmup = requests.front();
    std::mt19937_64 rng(o.prompt_seed ^ 0x5eedull);
    std::shuffle(warmup.prompt_ids.begin(), warmup.prompt_ids.end(), rng);
    warmup.sampling.max_tokens = std::min(2, w.output_len_tokens);
    const RequestId warmup_id = static_cast<RequestId>(w.num_requests);
    if (Status st = engine->add_request(warmup_id, warmup); !st.ok()) {
      std::cerr << "error: the warm-up request was rejected: " << st.message() << "\n";
      return 1;
    }
    // With asynchronous scheduling a call may launch nothing and only collect the step in
    // flight: it is idle only when it also returns nothing.
    while (engine->has_unfinished_requests()) {
      const int64_t steps_before = engine->stats().num_steps;
      const bool has_output = !engine->step().empty();
      if (!has_output && engine->stats().num_steps == steps_before) {
        std::cerr << "error: the engine scheduled nothing for the warm-up request\n";
        return 1;
      }
    }
  }
  const EngineStats stats_before = engine->stats();
  engine->device_step_gaps();  // from here on
  const auto t0 = Clock::now();
  for (int i = 0; i < w.num_requests; ++i) {
    if (Status st = engine->add_request(static_cast<RequestId>(i), requests[i]); !st.ok()) {
      std::cerr << "error: request " << i << " was rejected: " << st.message() << "\n";
      return 1;
    }
  }
  // A step that schedules nothing while requests remain would loop forever; it cannot happen
  // with a KV cache that holds one full request (the engine guarantees that), but a benchmark
  // must end with a message rather than hang.
  int64_t idle_steps = 0;
  while (engine->has_unfinished_requests()) {
    const int64_t steps_before = engine->stats().num_steps;
    const std::vector<RequestOutput> outs = engine->step();
    const auto now = Clock::now();
    idle_steps = outs.empty() && engine->stats().num_steps == steps_before ? idle_steps + 1 : 0;
    if (idle_steps > 1000) {
      std::cerr << "error: the engine scheduled nothing for 1000 steps with requests unfinished\n";
      return 1;
    }
    for (const RequestOutput& out : outs) {
      Progress& pr = progress.at(out.request_id);
      if (!out.new_token_ids.empty() && !pr.ttft_s) pr.ttft_s = seconds_between(t0, now);
      pr.num_tokens += static_cast<int>(out.new_token_ids.size());
      if (out.finished()) pr.finish = out.finish_reason;
    }
  }
  const double wall_s = seconds_between(t0, Clock::now());
  const std::optional<StepGapStats> gaps = engine->device_step_gaps();

  int num_bad = 0;
  int64_t num_output_tokens = 0;
  std::vector<double> ttft_ms;
  for (int i = 0; i < w.num_requests; ++i) {
    const Progress& pr = progress[i];
    num_output_tokens += pr.num_tokens;
    if (pr.ttft_s) ttft_ms.push_back(1e3 * *pr.ttft_s);
    if (pr.num_tokens != w.output_len_tokens || pr.finish != FinishReason::kLength) {
      if (++num_bad <= 10)
        std::cerr << "error: request " << i << " produced " << pr.num_tokens << " tokens (finish reason "
                  << finish_reason_name(pr.finish) << "), expected exactly " << w.output_len_tokens << "\n";
    }
  }
  const int64_t num_prompt_tokens = static_cast<int64_t>(w.num_requests) * w.prompt_len_tokens;
  std::sort(ttft_ms.begin(), ttft_ms.end());
  const double flops = w.num_requests * request_flops(mc, w);
  EngineStats stats = engine->stats();
  stats.num_steps -= stats_before.num_steps;
  stats.num_preemptions -= stats_before.num_preemptions;

  std::ostringstream s;
  char line[512];
  s << "### dsinfer bench --workload " << w.num_requests << "x" << w.prompt_len_tokens << "x" << w.output_len_tokens
    << " — " << mc.architecture << (cfg.dummy_weights ? " (random weights)" : "") << ", hidden " << mc.hidden_size
    << ", " << mc.num_hidden_layers << " layers, backend " << cfg.backend << "\n\n"
    << "- date: " << utc_timestamp() << "\n- machine: " << o.machine << "\n- command: `" << o.command << "`\n"
    << "- engine: max batched tokens " << cfg.max_num_batched_tokens << ", max sequences " << cfg.max_num_seqs
    << (cfg.async_scheduling ? ", asynchronous scheduling" : "")
    << ", " << stats.num_kv_blocks_total << " KV blocks of " << cfg.block_size_tokens << " tokens; "
    << stats.num_steps << " steps, " << stats.num_preemptions << " preemptions\n"
    << "- all requests submitted at once after one warm-up request; random prompt ids (seed " << o.prompt_seed
    << "), greedy, eos ignored; time to first token counted from submission\n";
  if (gemm_flops > 0) {
    std::snprintf(line, sizeof line, "- GEMM ceiling measured in the same run (%s): %.4g TFLOP/s\n",
                  cfg.backend != "cuda" ? "fp32 matmul" : cfg.dummy_fp8 ? "cuBLASLt block-scaled FP8" : "cuBLASLt bf16",
                  gemm_flops / 1e12);
    s << line;
  }
  s << "\ncompleted: " << (w.num_requests - num_bad) << " of " << w.num_requests << " requests, "
    << num_output_tokens << " output tokens (" << w.output_len_tokens << " each), " << num_prompt_tokens
    << " prompt tokens\n\n";
  s << "| wall s | requests/s | output tok/s | total tok/s | TTFT mean ms | TTFT p50 ms | TTFT p99 ms | model TFLOP/s "
       "| of GEMM ceiling |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  double ttft_mean = 0;
  for (double v : ttft_ms) ttft_mean += v / static_cast<double>(ttft_ms.size());
  const double p50 = ttft_ms.empty() ? 0 : percentile(ttft_ms, 50), p99 = ttft_ms.empty() ? 0 : percentile(ttft_ms, 99);
  char ratio[32] = "n/a";
  if (gemm_flops > 0) std::snprintf(ratio, sizeof ratio, "%.1f%%", 100.0 * flops / wall_s / gemm_flops);
  std::snprintf(line, sizeof line, "| %.3f | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.4g | %s |\n", wall_s,
                w.num_requests / wall_s, num_output_tokens / wall_s, (num_prompt_tokens + num_output_tokens) / wall_s,
                ttft_mean, p50, p99, flops / wall_s / 1e12, ratio);
  s << line;
  if (gaps) {
    auto summary = [&](const char* what, const StepGapStats::Summary& g) {
      std::snprintf(line, sizeof line,
                    "- device idle between consecutive %s (CUDA events): %lld gaps, median %.1f µs, p99 %.1f µs, "
                    "max %.1f µs, %.1f ms in all (%.2f%% of the wall time)\n",
                    what, static_cast<long long>(g.num_gaps), g.median_us, g.p99_us, g.max_us, g.total_us / 1e3,
                    100.0 * g.total_us / 1e6 / wall_s);
      s << line;
    };
    s << "\n";
    summary("steps", gaps->all);
    summary("decode-only steps", gaps->decode_only);
  }
  std::cout << s.str() << std::flush;
  if (num_bad > 0) {
    // A run that did not do the work it claims is not a result: nothing is appended.
    std::cerr << "error: " << num_bad << " of " << w.num_requests << " requests did not produce exactly "
              << w.output_len_tokens << " tokens\n";
    return 1;
  }
  if (!o.results_path.empty() && !append_results(o.results_path, s.str())) {
    std::cerr << "error: cannot append to " << o.results_path << "\n";
    return 1;
  }
  return 0;
}

}  // namespace dsinfer::cli
