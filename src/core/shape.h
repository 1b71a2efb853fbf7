// Tensor shapes as the project writes them: a list of dimension sizes, outermost first.
#pragma once

#include <cstdint>
#include <vector>

namespace dsinfer {

// The number of elements of a tensor of this shape (1 for a scalar's empty shape).
inline int64_t num_elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace dsinfer
