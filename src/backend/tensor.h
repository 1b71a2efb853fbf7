// A tensor resident on a backend's device: typed shape plus storage that the backend owns.
// The CPU backend's storage is host memory; the CUDA backend's is device memory.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace dsinfer {

struct Tensor {
  std::shared_ptr<void> storage;  // keeps the allocation alive; data may point inside it
  void* data = nullptr;
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;

  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
  int64_t num_elements() const { return dsinfer::num_elements(shape); }
  size_t num_bytes() const { return num_elements() * dtype_size_bytes(dtype); }
  bool empty() const { return data == nullptr; }
  template <typename T> T* as() { return static_cast<T*>(data); }
  template <typename T> const T* as() const { return static_cast<const T*>(data); }
};

}  // namespace dsinfer
