// Time to first token of a long prompt on the demo model (CPU backend), by where its prefix
// KV comes from: computed (cold), device prefix cache, host tier, block store. Each figure is
// the median of repeats and is reported as a fraction of the cold time of the same run.
//
// usage: bench_kv_ttft [--model DIR] [--prompt-tokens N] [--repeats N] [--append RESULTS.md]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/logging.h"
#include "engine/engine_core.h"

namespace {

using namespace dsinfer;
namespace fs = std::filesystem;

double ttft_ms(EngineCore& engine, RequestId id, const std::vector<TokenId>& prompt, PromptCacheStats* stats) {
  GenerationRequest r;
  r.prompt_ids = prompt;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 1;
  r.sampling.ignore_eos = true;
  const auto t0 = std::chrono::steady_clock::now();
  if (!engine.add_request(id, r).ok()) return -1;
  for (;;) {
    for (const RequestOutput& out : engine.step()) {
      if (out.request_id != id || out.new_token_ids.empty()) continue;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      *stats = out.prompt_cache;
      while (engine.has_unfinished_requests()) engine.step();
      return ms;
    }
  }
}

void drop_tree_from_cache(const std::string& dir) {
  for (auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir = std::string(DSINFER_SOURCE_DIR) + "/models/demo";
  std::string append_path;
  int num_prompt_tokens = 4000;
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--model") model_dir = next();
    else if (a == "--prompt-tokens") num_prompt_tokens = std::stoi(next());
    else if (a == "--repeats") repeats = std::max(1, std::stoi(next()));
    else if (a == "--append") append_path = next();
    else {
      std::fprintf(stderr, "usage: %s [--model DIR] [--prompt-tokens N] [--repeats N] [--append FILE]\n", argv[0]);
      return 2;
    }
  }
  set_log_level(LogLevel::kWarn);
  std::string tmpl = (fs::temp_directory_path() / "dsinfer-kv-ttft-XXXXXX").string();
  const std::string store_dir = ::mkdtemp(tmpl.data());

  EngineConfig base;
  base.model_dir = model_dir;
  base.print_load_progress = false;
  base.block_size_tokens = 64;
  base.max_num_batched_tokens = 8192;  // the whole prompt in one step
  base.kv_tiers.store_unit_tokens = 128;

  std::mt19937 rng(7);
  auto make_prompt = [&](int vocab) {
    std::vector<TokenId> p(num_prompt_tokens);
    for (TokenId& t : p) t = static_cast<TokenId>(2 + rng() % (vocab - 2));
    return p;
  };

  std::vector<double> cold, device, host, store_cold, store_warm;
  PromptCacheStats s_device, s_host, s_store;
  RequestId next_id = 1;
  for (int rep = 0; rep < repeats; ++rep) {
    // Cold and device hit: one engine, no tiers.
    EngineCore plain(base);
    const int vocab = plain.model_config().vocab_size;
    const std::vector<TokenId> prompt = make_prompt(vocab);
    const std::vector<TokenId> other = make_prompt(vocab);
    PromptCacheStats s;
    cold.push_back(ttft_ms(plain, next_id++, prompt, &s));
    device.push_back(ttft_ms(plain, next_id++, prompt, &s_device));

    // Host hit: a pool of one prompt's size, so a second prompt pushes the first to the host.
    EngineConfig hc = base;
    hc.num_kv_blocks = 1;  // raised to the minimum: one max-length request
    hc.kv_tiers.host_cache_bytes = 1LL << 30;
    EngineCore with_host(hc);
    ttft_ms(with_host, next_id++, prompt, &s);
    ttft_ms(with_host, next_id++, other, &s);
    host.push_back(ttft_ms(with_host, next_id++, prompt, &s_host));

    // Store hit: one engine writes, a fresh one (as another process) reads.
    EngineConfig sc = base;
    sc.kv_tiers.store_enabled = true;
    sc.kv_tiers.store_directory = store_dir + "/rep" + std::to_string(rep);
    {
      EngineCore writer(sc);
      ttft_ms(writer, next_id++, prompt, &s);
    }
    drop_tree_from_cache(sc.kv_tiers.store_directory);
    {
      EngineCore reader(sc);
      store_cold.push_back(ttft_ms(reader, next_id++, prompt, &s_store));
    }
    {
      EngineCore reader(sc);
      store_warm.push_back(ttft_ms(reader, next_id++, prompt, &s));
    }
  }
  fs::remove_all(store_dir);

  const double c = median(cold);
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::ostringstream out;
  out << "\n## KV cache: time to first token by tier (" << date << ")\n\n"
      << "Machine: dev box: 2-core x86-64, Debian 12. Command: `build/bench_kv_ttft";
  for (int i = 1; i < argc; ++i) out << " " << argv[i];
  out << "`\n\n"
      << "Demo model (" << fs::path(model_dir).filename().string() << "), CPU backend, " << num_prompt_tokens
      << "-token prompt, 1 output token, 64-token device blocks, 128-token store units; engine-level "
      << "(no HTTP). Median of " << repeats << ". Store hit = a fresh engine on the directory another "
      << "engine wrote; cold page cache = its files dropped from the page cache first.\n\n"
      << "| prefix from | cached tokens | TTFT ms | fraction of cold |\n|---|---:|---:|---:|\n";
  char line[200];
  auto row = [&](const char* name, int cached, double ms) {
    std::snprintf(line, sizeof(line), "| %s | %d | %.1f | %.3f |\n", name, cached, ms, ms / c);
    out << line;
  };
  row("computed (cold)", 0, c);
  row("device prefix cache", s_device.num_cached_tokens(), median(device));
  row("host tier", s_host.num_cached_tokens(), median(host));
  row("block store, cold page cache", s_store.num_cached_tokens(), median(store_cold));
  row("block store, warm page cache", s_store.num_cached_tokens(), median(store_warm));
  std::snprintf(line, sizeof(line), "\nHost-tier run: %d of its cached tokens from the host, %d from the device.\n",
                s_host.num_host_hit_tokens, s_host.num_device_hit_tokens);
  out << line;
  std::fputs(out.str().c_str(), stdout);
  if (!append_path.empty()) {
    std::ofstream f(append_path, std::ios::app);
    f << out.str();
  }
  return 0;
}
