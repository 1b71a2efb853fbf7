// SafetensorsWriter: builds safetensors files (tests, tools that repack or cut checkpoints).
//
// Tensors are written in the order added, packed back to back; the header is padded with
// spaces to a multiple of 8 bytes so the data section starts 8-byte aligned.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace dsinfer {

class SafetensorsWriter {
 public:
  // Copies num_bytes from data; num_bytes must equal dtype size x product(shape) (DS_CHECK).
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data,
           size_t num_bytes);
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& values);
  // A tensor of zero bytes; write() leaves it as a hole in a sparse file, so huge synthetic
  // checkpoints cost no disk.
  void add_zeros(const std::string& name, DType dtype, const std::vector<int64_t>& shape);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  std::string header_json() const;
  // The whole file image in memory (zero tensors materialised).
  std::string serialize() const;
  // Writes to path; throws dsinfer::Error naming the path on I/O failure.
  void write(const std::string& path) const;
  size_t num_tensors() const { return entries_.size(); }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::string bytes;   // empty for zero tensors
    size_t num_bytes;
    size_t offset;       // within the data section
  };
  std::string padded_header() const;

  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
  size_t data_bytes_ = 0;
};

}  // namespace dsinfer
