#include "model/checkpoint.h"

#include "model/json_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <unordered_map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace dsinfer {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

size_t file_size_or_zero(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<size_t>(st.st_size) : 0;
}

// Shard names come from a file we did not write: keep them inside the model directory.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name.find('\\') == std::string::npos &&
         name != "." && name != "..";
}

// model.safetensors.index.json, reduced to what open() checks.
struct ShardIndex {
  std::vector<std::string> shards;                       // unique, sorted
  std::vector<std::string> first_tensor;                 // per shard, for error messages
  std::unordered_map<std::string, uint32_t> shard_of;    // tensor -> position in shards
};

ShardIndex read_index(const std::string& index_path) {
  // DeepSeek-V3's index is ~9 MB; anything far larger is not an index.
  const json j = read_json_file(index_path, size_t{256} << 20, StatusCode::kDataLoss, "an index");
  auto it = j.is_object() ? j.find("weight_map") : j.end();
  if (it == j.end() || !it->is_object()) {
    throw Error(StatusCode::kDataLoss, index_path + ": missing \"weight_map\" object");
  }
  if (it->empty()) throw Error(StatusCode::kDataLoss, index_path + ": weight_map is empty");
  ShardIndex index;
  std::map<std::string, uint32_t> positions;  // shard -> provisional position (first mention)
  index.shard_of.reserve(it->size());
  for (auto e = it->begin(); e != it->end(); ++e) {
    const json& v = e.value();
    if (!v.is_string() || !is_plain_file_name(v.get_ref<const std::string&>())) {
      throw Error(StatusCode::kDataLoss, index_path + ": weight_map entry for tensor \"" + e.key() +
                                             "\" must be a file name in the model directory, got " + v.dump());
    }
    auto [pos, added] = positions.emplace(v.get_ref<const std::string&>(), 0);
    if (added) {
      pos->second = static_cast<uint32_t>(index.shards.size());
      index.shards.push_back(pos->first);
      index.first_tensor.push_back(e.key());
    }
    index.shard_of.emplace(e.key(), pos->second);
  }
  // Open shards in name order (model-00001-of-N first): progress reads naturally and the
  // files are visited in the order they were written.
  std::vector<uint32_t> sorted_position(index.shards.size());
  std::vector<std::string> sorted_first(index.shards.size());
  index.shards.clear();
  for (const auto& [shard, provisional] : positions) {
    sorted_position[provisional] = static_cast<uint32_t>(index.shards.size());
    sorted_first[index.shards.size()] = std::move(index.first_tensor[provisional]);
    index.shards.push_back(shard);
  }
  index.first_tensor = std::move(sorted_first);
  for (auto& [tensor, shard] : index.shard_of) shard = sorted_position[shard];
  return index;
}

}  // namespace

Checkpoint::~Checkpoint() = default;

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& model_dir, ProgressFn progress) {
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    throw Error(StatusCode::kNotFound, model_dir + ": not a directory");
  }
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = model_dir;
  const std::string index_path = model_dir + "/" + kIndexName;

  ShardIndex index;
  const bool have_index = is_regular_file(index_path);
  std::vector<std::string> file_names;
  if (have_index) {
    index = read_index(index_path);
    for (size_t i = 0; i < index.shards.size(); ++i) {
      if (!is_regular_file(model_dir + "/" + index.shards[i])) {
        throw Error(StatusCode::kNotFound, index_path + ": shard \"" + index.shards[i] + "\" (holding e.g. tensor \"" +
                                               index.first_tensor[i] + "\") does not exist in " + model_dir);
      }
    }
    file_names = index.shards;
  } else if (is_regular_file(model_dir + "/" + kSingleName)) {
    file_names.push_back(kSingleName);
  } else {
    // No index: accept any set of *.safetensors files whose tensor names do not collide.
    for (const auto& entry : fs::directory_iterator(model_dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file(ec) && name.size() > 12 && name.ends_with(".safetensors")) {
        file_names.push_back(name);
      }
    }
    std::sort(file_names.begin(), file_names.end());
    if (file_names.empty()) {
      throw Error(StatusCode::kNotFound, model_dir + ": no " + kSingleName + ", " + kIndexName +
                                             " or other *.safetensors file");
    }
  }

  for (const std::string& name : file_names) ckpt->total_bytes_ += file_size_or_zero(model_dir + "/" + name);
  size_t done_bytes = 0;
  if (progress) progress(0, ckpt->total_bytes_);

  ckpt->tensors_.reserve(have_index ? index.shard_of.size() : 0);
  for (size_t f = 0; f < file_names.size(); ++f) {
    const std::string path = model_dir + "/" + file_names[f];
    ckpt->files_.push_back(SafetensorsFile::open(path));
    const SafetensorsFile& file = *ckpt->files_.back();
    for (const TensorInfo& t : file.tensors()) {
      if (have_index) {
        auto it = index.shard_of.find(t.name);
        if (it == index.shard_of.end()) {
          throw Error(StatusCode::kDataLoss, path + ": holds tensor \"" + t.name + "\" which " + index_path +
                                                 " does not list");
        }
        // file_names == index.shards, so positions coincide.
        if (it->second != f) {
          throw Error(StatusCode::kDataLoss, path + ": holds tensor \"" + t.name + "\" which " + index_path +
                                                 " places in \"" + index.shards[it->second] + "\"");
        }
      }
      auto [pos, inserted] = ckpt->tensors_.emplace(std::string_view(t.name), &t);
      if (!inserted) {
        throw Error(StatusCode::kDataLoss, path + ": tensor \"" + t.name + "\" also appears in " + pos->second->file);
      }
    }
    done_bytes += file.file_size_bytes();
    if (progress) progress(std::min(done_bytes, ckpt->total_bytes_), ckpt->total_bytes_);
  }

  // Every shard tensor is listed under its own shard and names are unique, so equal counts
  // mean every listed tensor was found.
  if (have_index && ckpt->tensors_.size() != index.shard_of.size()) {
    std::string missing;
    uint32_t shard = 0;
    for (const auto& [tensor, s] : index.shard_of) {
      if (!ckpt->has(tensor) && (missing.empty() || tensor < missing)) {
        missing = tensor;
        shard = s;
      }
    }
    throw Error(StatusCode::kDataLoss, index_path + ": tensor \"" + missing + "\" is not in its shard \"" +
                                           index.shards[shard] + "\"");
  }
  return ckpt;
}

bool Checkpoint::has(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

const TensorInfo& Checkpoint::get(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    throw Error(StatusCode::kNotFound, dir_ + ": checkpoint has no tensor \"" + std::string(name) + "\"");
  }
  return *it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.emplace_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

// ---- LoadProgressPrinter ----

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

LoadProgressPrinter::LoadProgressPrinter(std::string label, ClockFn clock)
    : label_(std::move(label)), clock_(clock ? std::move(clock) : ClockFn(now_seconds)) {}

std::string LoadProgressPrinter::format_line(const std::string& label, size_t done_bytes, size_t total_bytes) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const double pct = total_bytes == 0 ? 100.0 : 100.0 * static_cast<double>(done_bytes) / static_cast<double>(total_bytes);
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s: %.1f/%.1f GiB (%.0f%%)", label.c_str(),
                static_cast<double>(done_bytes) / kGiB, static_cast<double>(total_bytes) / kGiB, pct);
  return buf;
}

void LoadProgressPrinter::operator()(size_t done_bytes, size_t total_bytes) {
  // Small checkpoints load in well under a second: a progress line would only be noise in
  // logs, unless a person is watching a terminal.
  if (total_bytes <= kMinTotalBytes && !isatty(STDERR_FILENO)) return;
  const bool final_call = done_bytes >= total_bytes;
  const double now = clock_();
  if (final_call) {
    if (num_lines_printed_ == 0 && total_bytes <= kMinTotalBytes) return;
  } else if (last_print_seconds_ >= 0.0 && now - last_print_seconds_ < kMinIntervalSeconds) {
    return;
  }
  std::fprintf(stderr, "%s\n", format_line(label_, done_bytes, total_bytes).c_str());
  last_print_seconds_ = now;
  ++num_lines_printed_;
}

}  // namespace dsinfer
