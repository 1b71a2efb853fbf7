#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/shape.h"
#include "core/status.h"

namespace dsinfer {

namespace {

using nlohmann::json;

// The reference implementation refuses headers over 100 MB; a V3 shard's header is ~100 KB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// A valid header nests at most three levels ({name: {shape: [..]}}); refuse deep nesting
// before handing the text to the JSON parser.
constexpr int kMaxHeaderDepth = 4;

[[noreturn]] void corrupt(const std::string& file, const std::string& what) {
  throw Error(StatusCode::kDataLoss, file + ": " + what);
}

[[noreturn]] void corrupt_tensor(const std::string& file, const std::string& tensor, const std::string& what) {
  throw Error(StatusCode::kDataLoss, file + ": tensor \"" + tensor + "\": " + what);
}

bool nesting_within(const uint8_t* p, size_t n, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t c = p[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

// Reads a non-negative integer that fits in uint64 from a JSON value.
bool as_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = static_cast<uint64_t>(s);
    return true;
  }
  return false;
}

}  // namespace

int64_t TensorInfo::num_elements() const { return dsinfer::num_elements(shape); }

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, size_bytes_);
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO named like a shard must not hang the loader; fstat then rejects it.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    throw Error(err == ENOENT ? StatusCode::kNotFound : StatusCode::kDataLoss,
                path + ": cannot open: " + std::strerror(err));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    corrupt(path, "not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    corrupt(path, "truncated: " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (map == MAP_FAILED) corrupt(path, std::string("mmap failed: ") + std::strerror(map_err));

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;
  file->size_bytes_ = size;
  // Weights are read once, front to back, when copied to the device or repacked.
  madvise(map, size, MADV_SEQUENTIAL);
  file->parse(static_cast<const uint8_t*>(map), size);
  return file;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::from_memory(const uint8_t* bytes, size_t num_bytes,
                                                              const std::string& name) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = name;
  file->size_bytes_ = num_bytes;
  file->parse(bytes, num_bytes);
  return file;
}

void SafetensorsFile::prefetch() const {
  if (map_ != nullptr) madvise(map_, size_bytes_, MADV_WILLNEED);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::parse(const uint8_t* bytes, size_t num_bytes) {
  const std::string& file = path_;
  if (bytes == nullptr || num_bytes < 8) {
    corrupt(file, "truncated: " + std::to_string(num_bytes) + " bytes, shorter than the 8-byte header length");
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[i];
  if (header_bytes > num_bytes - 8) {
    corrupt(file, "header length " + std::to_string(header_bytes) + " runs past the end of the file (" +
                      std::to_string(num_bytes) + " bytes); the file is truncated or not safetensors");
  }
  if (header_bytes > kMaxHeaderBytes) corrupt(file, "header length " + std::to_string(header_bytes) + " exceeds 100 MB");
  const uint8_t* header = bytes + 8;
  if (header_bytes == 0 || header[0] != '{') corrupt(file, "header does not start with '{'");
  if (!nesting_within(header, header_bytes, kMaxHeaderDepth)) corrupt(file, "header JSON is nested too deeply");

  json j;
  try {
    j = json::parse(header, header + header_bytes);
  } catch (const json::exception& e) {
    corrupt(file, std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) corrupt(file, "header is not a JSON object");

  data_offset_bytes_ = 8 + header_bytes;
  const uint64_t data_bytes = num_bytes - data_offset_bytes_;
  const uint8_t* data = bytes + data_offset_bytes_;

  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) per tensor, parallel to tensors_
  tensors_.reserve(j.size());
  ranges.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) corrupt(file, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) corrupt(file, "__metadata__ value \"" + m.key() + "\" is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (name.empty()) corrupt(file, "a tensor has an empty name");
    if (!v.is_object()) corrupt_tensor(file, name, "entry is not an object");

    auto dtype_it = v.find("dtype");
    if (dtype_it == v.end() || !dtype_it->is_string()) corrupt_tensor(file, name, "missing or non-string \"dtype\"");
    TensorInfo t;
    t.name = name;
    t.file = file;
    const std::string dtype_str = dtype_it->get<std::string>();
    if (!parse_dtype(dtype_str, &t.dtype)) corrupt_tensor(file, name, "unknown dtype \"" + dtype_str + "\"");

    auto shape_it = v.find("shape");
    if (shape_it == v.end() || !shape_it->is_array()) corrupt_tensor(file, name, "missing or non-list \"shape\"");
    uint64_t num_elements = 1;
    for (const json& d : *shape_it) {
      uint64_t dim = 0;
      if (!as_u64(d, &dim) || dim > static_cast<uint64_t>(INT64_MAX)) {
        corrupt_tensor(file, name, "shape " + shape_it->dump() + " has a dimension that is not a non-negative integer");
      }
      if (__builtin_mul_overflow(num_elements, dim, &num_elements)) {
        corrupt_tensor(file, name, "shape " + shape_it->dump() + " overflows");
      }
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t expected_bytes = 0;
    if (__builtin_mul_overflow(num_elements, static_cast<uint64_t>(dtype_size_bytes(t.dtype)), &expected_bytes) ||
        num_elements > static_cast<uint64_t>(INT64_MAX)) {
      corrupt_tensor(file, name, "shape " + shape_it->dump() + " overflows");
    }

    auto off_it = v.find("data_offsets");
    uint64_t begin = 0, end = 0;
    if (off_it == v.end() || !off_it->is_array() || off_it->size() != 2 || !as_u64((*off_it)[0], &begin) ||
        !as_u64((*off_it)[1], &end)) {
      corrupt_tensor(file, name, "\"data_offsets\" must be [begin, end] with non-negative integers");
    }
    if (begin > end) corrupt_tensor(file, name, "data_offsets " + off_it->dump() + " end before they begin");
    if (end > data_bytes) {
      corrupt_tensor(file, name, "data_offsets " + off_it->dump() + " run past the data section (" +
                                     std::to_string(data_bytes) + " bytes); the file is truncated or corrupt");
    }
    if (end - begin != expected_bytes) {
      corrupt_tensor(file, name, "data_offsets " + off_it->dump() + " span " + std::to_string(end - begin) +
                                     " bytes but " + dtype_str + " " + shape_to_string(t.shape) + " needs " +
                                     std::to_string(expected_bytes));
    }
    t.data = data + begin;
    t.num_bytes = static_cast<size_t>(expected_bytes);
    tensors_.push_back(std::move(t));
    ranges.emplace_back(begin, end);
  }

  // Order by data offset, then check that no two tensors share bytes.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ranges[a] < ranges[b];
  });
  std::vector<TensorInfo> sorted;
  sorted.reserve(tensors_.size());
  uint64_t prev_end = 0;
  const std::string* prev_name = nullptr;
  for (size_t i : order) {
    const auto [begin, end] = ranges[i];
    if (begin < end) {  // empty tensors occupy no bytes
      if (prev_name != nullptr && begin < prev_end) {
        corrupt_tensor(file, tensors_[i].name, "data overlaps tensor \"" + *prev_name + "\"");
      }
      prev_end = end;
      prev_name = &tensors_[i].name;
    }
  }
  for (size_t i : order) sorted.push_back(std::move(tensors_[i]));
  tensors_ = std::move(sorted);
  index_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(std::string_view(tensors_[i].name), i);
}

}  // namespace dsinfer
