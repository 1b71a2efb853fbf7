// SafetensorsFile: a read-only, memory-mapped safetensors file whose header has been checked.
//
// Format: 8-byte little-endian header length N, then N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the data section; offsets are relative to the data section.
//
// Contract: open() either returns a file whose every TensorInfo points inside the mapping with
// num_bytes == dtype size x product(shape), tensors not overlapping, dtypes known; or throws
// dsinfer::Error (kDataLoss for corrupt/truncated files, kNotFound for a missing file) whose
// message names the file and, where one is at fault, the tensor. Data pointers stay valid as
// long as the SafetensorsFile lives. open() reads only the header; weight pages are faulted in
// when first touched (a file truncated by someone else after open() then raises SIGBUS, as
// with any mapping). A SafetensorsFile is immutable after open() and safe to read from many
// threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"

namespace dsinfer {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the file's mapping; may be unaligned (check before casting)
  size_t num_bytes = 0;
  std::string file;  // path of the file holding it
  int64_t num_elements() const;
};

// "[a, b, c]" for error messages.
std::string shape_to_string(const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  // Maps `path` (read-only, MAP_PRIVATE) and validates its header. Throws Error.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  // Parses and validates an in-memory image (no copy: `bytes` must outlive the result).
  // `name` is used in error messages. This is what open() uses after mapping, and what the
  // fuzzer drives.
  static std::unique_ptr<SafetensorsFile> from_memory(const uint8_t* bytes, size_t num_bytes,
                                                      const std::string& name);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // In header order of data offsets (ascending begin).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t file_size_bytes() const { return size_bytes_; }
  size_t data_offset_bytes() const { return data_offset_bytes_; }

  // Advises the kernel that the whole mapping will be read soon (MADV_WILLNEED).
  void prefetch() const;

 private:
  SafetensorsFile() = default;
  void parse(const uint8_t* bytes, size_t num_bytes);

  std::string path_;
  void* map_ = nullptr;  // non-null when this object owns an mmap
  size_t size_bytes_ = 0;
  size_t data_offset_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  // name -> position in tensors_; keys view the names inside tensors_, which never change
  // after parse().
  std::unordered_map<std::string_view, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dsinfer
