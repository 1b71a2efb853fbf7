// Checkpoint: every tensor of a model directory, from model.safetensors or from the shards
// listed in model.safetensors.index.json ({"weight_map": {tensor: shard file}}).
//
// Contract: open() throws dsinfer::Error naming the directory and file when the directory
// holds neither form, a shard is missing or corrupt, the index names a tensor that is not in
// its shard, a shard holds a tensor the index does not list or maps elsewhere, or a tensor
// appears twice. Without an index, a directory with several *.safetensors files is also
// accepted (their union, names unique). TensorInfo data stays valid while the Checkpoint lives.
// A Checkpoint is immutable after open() and safe to read from many threads. open() maps and
// checks headers only; it does not validate tensors against a config (validate_checkpoint()).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/safetensors.h"

namespace dsinfer {

class Checkpoint {
 public:
  // Called after each file is mapped and validated, with bytes done so far and the total.
  using ProgressFn = std::function<void(size_t done_bytes, size_t total_bytes)>;

  static std::unique_ptr<Checkpoint> open(const std::string& model_dir, ProgressFn progress = nullptr);
  ~Checkpoint();

  const std::string& dir() const { return dir_; }
  bool has(std::string_view name) const;
  // Throws Error (kNotFound) naming the tensor and the directory.
  const TensorInfo& get(std::string_view name) const;
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  std::vector<std::string> names() const;  // sorted
  size_t num_tensors() const { return tensors_.size(); }
  size_t total_bytes() const { return total_bytes_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  Checkpoint() = default;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  // Keys view TensorInfo::name inside files_, which live as long as the Checkpoint.
  std::unordered_map<std::string_view, const TensorInfo*> tensors_;
  size_t total_bytes_ = 0;
};

// Prints "loading weights: 12.3/689.0 GiB (2%)" lines to stderr, at most every 0.5 s, when
// the checkpoint is larger than 1 GiB or stderr is a terminal; the final call (done == total)
// always prints when anything was printed before. Use as Checkpoint::ProgressFn via operator().
class LoadProgressPrinter {
 public:
  static constexpr size_t kMinTotalBytes = size_t{1} << 30;
  static constexpr double kMinIntervalSeconds = 0.5;

  using ClockFn = std::function<double()>;  // seconds on a monotonic clock

  explicit LoadProgressPrinter(std::string label = "loading weights", ClockFn clock = nullptr);
  void operator()(size_t done_bytes, size_t total_bytes);
  // Formats one progress line (no newline); exposed for tests.
  static std::string format_line(const std::string& label, size_t done_bytes, size_t total_bytes);
  int num_lines_printed() const { return num_lines_printed_; }

 private:
  std::string label_;
  ClockFn clock_;
  double last_print_seconds_ = -1.0;
  int num_lines_printed_ = 0;
};

}  // namespace dsinfer
