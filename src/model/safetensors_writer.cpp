#include "model/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/status.h"

namespace dsinfer {

namespace {
size_t bytes_of(DType dtype, const std::vector<int64_t>& shape) {
  size_t n = dtype_size_bytes(dtype);
  for (int64_t d : shape) {
    DS_CHECK(d >= 0);
    n *= static_cast<size_t>(d);
  }
  return n;
}
}  // namespace

void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            const void* data, size_t num_bytes) {
  DS_CHECK_MSG(num_bytes == bytes_of(dtype, shape), "tensor " << name << ": " << num_bytes << " bytes given");
  Entry e{name, dtype, shape, std::string(static_cast<const char*>(data), num_bytes), num_bytes, data_bytes_};
  data_bytes_ += num_bytes;
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::add_f32(const std::string& name, const std::vector<int64_t>& shape,
                                const std::vector<float>& values) {
  add(name, DType::kF32, shape, values.data(), values.size() * sizeof(float));
}

void SafetensorsWriter::add_zeros(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  const size_t n = bytes_of(dtype, shape);
  entries_.push_back({name, dtype, shape, std::string(), n, data_bytes_});
  data_bytes_ += n;
}

std::string SafetensorsWriter::header_json() const {
  nlohmann::json j = nlohmann::json::object();
  if (!metadata_.empty()) j["__metadata__"] = metadata_;
  for (const Entry& e : entries_) {
    j[e.name] = {{"dtype", dtype_name(e.dtype)},
                 {"shape", e.shape},
                 {"data_offsets", {e.offset, e.offset + e.num_bytes}}};
  }
  return j.dump();
}

std::string SafetensorsWriter::padded_header() const {
  std::string header = header_json();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header;
}

std::string SafetensorsWriter::serialize() const {
  std::string out = padded_header();
  const size_t base = out.size();
  out.resize(base + data_bytes_, '\0');
  for (const Entry& e : entries_) {
    if (!e.bytes.empty()) std::memcpy(&out[base + e.offset], e.bytes.data(), e.num_bytes);
  }
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  const std::string header = padded_header();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(StatusCode::kInternal, path + ": cannot create: " + std::strerror(errno));
  auto write_at = [&](const char* p, size_t n, off_t offset) {
    while (n > 0) {
      ssize_t w = ::pwrite(fd, p, n, offset);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = errno;
        ::close(fd);
        throw Error(StatusCode::kInternal, path + ": write failed: " + std::strerror(err));
      }
      p += w;
      n -= static_cast<size_t>(w);
      offset += w;
    }
  };
  write_at(header.data(), header.size(), 0);
  for (const Entry& e : entries_) {
    if (!e.bytes.empty()) write_at(e.bytes.data(), e.num_bytes, static_cast<off_t>(header.size() + e.offset));
  }
  // Extends the file over trailing zero tensors without writing them.
  if (::ftruncate(fd, static_cast<off_t>(header.size() + data_bytes_)) != 0 || ::close(fd) != 0) {
    throw Error(StatusCode::kInternal, path + ": cannot finish: " + std::strerror(errno));
  }
}

}  // namespace dsinfer
