// How long opening and validating a DeepSeek-V3-sized checkpoint takes, next to the cost of
// merely parsing the same safetensors headers as JSON (the floor any loader pays).
//
// The checkpoint is synthetic: 163 sparse shards (the hub's layout) holding every tensor of
// the 671B FP8 model with its scales, ~689 GB apparent size and no data blocks on disk.
//
// usage: bench_checkpoint [--dir DIR] [--shards N] [--repeats N] [--no-append]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/expected_tensors.h"
#include "model/model_config.h"
#include "model/safetensors_writer.h"
#include "model/weights_fp8.h"

#include <cstring>
#include <random>

using namespace dsinfer;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

ModelConfig v3_config() {
  nlohmann::json j = {{"architectures", {"DeepseekV3ForCausalLM"}},
                      {"model_type", "deepseek_v3"},
                      {"num_nextn_predict_layers", 1},
                      {"max_position_embeddings", 163840},
                      {"quantization_config", {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}}}};
  return ModelConfig::from_json(j, "bench/config.json");
}

// Writes the shards and index; returns the number of tensors written.
size_t write_checkpoint(const std::string& dir, const ModelConfig& c, int num_shards) {
  std::vector<std::pair<ExpectedTensor, bool>> items;  // tensor, write as fp8
  for (const ExpectedTensor& t : expected_tensors(c)) items.emplace_back(t, t.quantizable && t.name.find("eh_proj") == std::string::npos);
  std::vector<SafetensorsWriter> shards(num_shards);
  nlohmann::json weight_map = nlohmann::json::object();
  size_t num_tensors = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const int s = static_cast<int>(i * num_shards / items.size());
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s + 1, num_shards);
    const auto& [t, fp8] = items[i];
    shards[s].add_zeros(t.name, fp8 ? DType::kF8E4M3 : DType::kBF16, t.shape);
    weight_map[t.name] = name;
    ++num_tensors;
    if (fp8) {
      shards[s].add_zeros(t.name + "_scale_inv", DType::kF32, fp8_scale_shape(t.shape, c.fp8));
      weight_map[t.name + "_scale_inv"] = name;
      ++num_tensors;
    }
  }
  for (int s = 0; s < num_shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s + 1, num_shards);
    shards[s].write(dir + "/" + name);
  }
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", weight_map}}.dump();
  return num_tensors;
}

// The floor: parse the index and each shard's header (read with pread) as JSON, nothing more.
double parse_headers_only(const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  std::ifstream index(dir + "/model.safetensors.index.json");
  size_t num_entries = nlohmann::json::parse(index).at("weight_map").size();
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    int fd = ::open(e.path().c_str(), O_RDONLY);
    uint64_t n = 0;
    if (::pread(fd, &n, 8, 0) != 8) std::abort();
    std::string header(n, '\0');
    if (::pread(fd, header.data(), n, 8) != static_cast<ssize_t>(n)) std::abort();
    ::close(fd);
    num_entries += nlohmann::json::parse(header).size();
  }
  if (num_entries == 0) std::abort();
  return seconds_since(t0);
}

// Dequantising one V3 expert projection ([2048, 7168] e4m3, 128x128 blocks) to fp32, next to
// a plain memcpy of the fp32 result (the memory-bound ceiling) and to the two-pass way
// (widen every code, then scale each element by its block's factor).
std::string bench_dequant(int repeats) {
  const int64_t rows = 2048, cols = 7168, br = 128, bc = 128;
  const int64_t n = rows * cols, col_blocks = cols / bc;
  std::vector<uint8_t> w(n);
  std::mt19937 rng(3);
  for (auto& b : w) b = static_cast<uint8_t>(rng() & 0x7e);  // finite codes only
  std::vector<float> scale((rows / br) * col_blocks, 0.01f);
  std::vector<float> out(n), src(n, 1.0f);
  auto best = [&](auto&& fn) {
    double b = 1e9;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      b = std::min(b, seconds_since(t0));
    }
    return b;
  };
  const double t_copy = best([&] { std::memcpy(out.data(), src.data(), n * sizeof(float)); });
  const double t_block = best([&] { dequantize_fp8_block(w.data(), scale.data(), rows, cols, br, bc, out.data()); });
  const double t_two_pass = best([&] {
    convert_to_f32(DType::kF8E4M3, w.data(), out.data(), n);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] *= scale[(r / br) * col_blocks + c / bc];
  });
  const double gb = n * sizeof(float) / 1e9;
  char table[768];
  std::snprintf(table, sizeof(table),
                "| fp8 [2048, 7168] -> fp32 | ms (best of %d) | GB/s written | ratio to memcpy |\n"
                "|---|---|---|---|\n"
                "| memcpy of the fp32 result (ceiling) | %.2f | %.1f | 1.00 |\n"
                "| dequantize_fp8_block | %.2f | %.1f | %.2f |\n"
                "| widen, then scale per element | %.2f | %.1f | %.2f |\n",
                repeats, t_copy * 1e3, gb / t_copy, t_block * 1e3, gb / t_block, t_block / t_copy,
                t_two_pass * 1e3, gb / t_two_pass, t_two_pass / t_copy);
  return table;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int num_shards = 163, repeats = 3;
  bool append = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--shards" && i + 1 < argc) num_shards = std::stoi(argv[++i]);
    else if (a == "--repeats" && i + 1 < argc) repeats = std::stoi(argv[++i]);
    else if (a == "--no-append") append = false;
    else {
      std::fprintf(stderr, "usage: bench_checkpoint [--dir DIR] [--shards N] [--repeats N] [--no-append]\n");
      return 2;
    }
  }
  std::string command = "build/bench_checkpoint";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  const bool own_dir = dir.empty();
  if (own_dir) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dsinfer_ckpt_bench_XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return 1;
    dir = tmpl;
  }

  const ModelConfig config = v3_config();
  auto t0 = std::chrono::steady_clock::now();
  const size_t num_tensors = write_checkpoint(dir, config, num_shards);
  const double write_s = seconds_since(t0);

  double best_parse = 1e9, best_open = 1e9, best_validate = 1e9;
  size_t total_bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    best_parse = std::min(best_parse, parse_headers_only(dir));
    t0 = std::chrono::steady_clock::now();
    auto ckpt = Checkpoint::open(dir);
    best_open = std::min(best_open, seconds_since(t0));
    total_bytes = ckpt->total_bytes();
    t0 = std::chrono::steady_clock::now();
    validate_checkpoint(*ckpt, config);
    best_validate = std::min(best_validate, seconds_since(t0));
  }
  if (own_dir) std::filesystem::remove_all(dir);
  const std::string dequant_table = bench_dequant(std::max(repeats, 5));

  char table[1024];
  std::snprintf(table, sizeof(table),
                "| step | ms (best of %d) | ratio to header JSON parse |\n"
                "|---|---|---|\n"
                "| parse index + %d shard headers as JSON (floor) | %.1f | 1.00 |\n"
                "| Checkpoint::open (mmap, parse, check, index) | %.1f | %.2f |\n"
                "| validate_checkpoint (%zu tensors) | %.1f | %.2f |\n",
                repeats, num_shards, best_parse * 1e3, best_open * 1e3, best_open / best_parse, num_tensors,
                best_validate * 1e3, best_validate / best_parse);
  std::printf("synthetic DeepSeek-V3 FP8 checkpoint: %d shards, %zu tensors, %.1f GiB apparent (written in %.1f s)\n%s",
              num_shards, num_tensors, total_bytes / double(1ull << 30), write_s, table);
  std::printf("\n%s", dequant_table.c_str());

  if (append) {
    const std::string path = std::string(DSINFER_SOURCE_DIR) + "/bench/RESULTS.md";
    const bool exists = std::filesystem::exists(path);
    std::ofstream out(path, std::ios::app);
    if (!exists) out << "# dsinfer benchmark results\n";
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
    out << "\n## Checkpoint open + validate, DeepSeek-V3-sized (" << date << ")\n\n"
        << "Machine: dev box: 2-core x86-64, Debian 12 (shared; ratios are the figures to compare). Command: `"
        << command << "`.\n"
        << "Synthetic sparse shards with every tensor of the 671B FP8 model and its scales ("
        << num_tensors << " tensors, " << (total_bytes >> 30) << " GiB apparent); no weight bytes are read.\n\n"
        << table << "\n" << dequant_table;
  }
  return 0;
}
