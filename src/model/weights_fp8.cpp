#include "model/weights_fp8.h"

#include <algorithm>
#include <array>

#include "core/check.h"
#include "core/dtype.h"

namespace dsinfer {

namespace {
// All 256 e4m3 codes decoded once; the inner loop is then a table lookup and a multiply.
const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}
}  // namespace

void dequantize_fp8_block(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols,
                          int block_rows, int block_cols, float* out) {
  DS_CHECK(rows >= 0 && cols >= 0 && block_rows > 0 && block_cols > 0);
  const std::array<float, 256>& table = fp8_table();
  const int64_t num_col_blocks = (cols + block_cols - 1) / block_cols;
  for (int64_t r = 0; r < rows; ++r) {
    const float* scale_row = scale_inv + (r / block_rows) * num_col_blocks;
    const uint8_t* src = w + r * cols;
    float* dst = out + r * cols;
    for (int64_t cb = 0; cb < num_col_blocks; ++cb) {
      const float scale = scale_row[cb];
      const int64_t begin = cb * block_cols;
      const int64_t end = std::min(cols, begin + block_cols);
      for (int64_t c = begin; c < end; ++c) dst[c] = table[src[c]] * scale;
    }
  }
}

}  // namespace dsinfer
